"""The run watch: a ``TrainerCallback`` beside the trainer that reads what a run already logs and its held-out
evaluations, and says so when the run goes wrong while nobody is looking (docs/watch.md).

    collapse    the training reward's two-step mean below ``watch_reward_drop`` of its best two-step mean (and 0.1
                below it), or entropy, completion length or the share of groups whose rewards differ under
                ``watch_floors``, for ``watch_patience`` logged steps in a row
    hacking     the training reward rose since the best evaluation while held-out accuracy fell from it: the paired
                95% interval of the difference, on the same problems, lies below 0
    forgetting  one kind of held-out problem fell that way since the first evaluation while the whole set did not
    plateau     the last ``watch_plateau_evals`` evaluations gained nothing over the best one (no paired interval
                above 0)

Evaluations are the periodic ones (``task_eval_steps``, on ``task_eval_max_samples`` problems), the policy the run
starts from (step 0: the evaluation before training, or after a warm start) and, at the end, the evaluation after
training against the one before (the whole held-out set). Each finding is one warning line naming the signal, the
steps and the numbers, a record in ``training_history.json`` (``watch``), a line in ``summary.md`` and a mark on
``training_curves.png``. ``stop_on: [degraded]`` ends the run after a finding, ``[plateau]`` on a plateau. The adapter
a run keeps is its best evaluated one: the last state, unless an earlier evaluation beats it with its paired interval
above 0 (``choose_kept``); a LoRA adapter's weights are copied at each new best, so no checkpoint is needed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback

from .evaluation.stats import paired_gain, points


logger = logging.getLogger(__name__)

REWARD_WINDOW = 2  # logged steps averaged into the reward the rules compare
MIN_REWARD_DROP = 0.1  # a collapse of the reward is also this far below its best (a reward near 0 wobbles)
MIN_REWARD_RISE = 0.05  # hacking: how much the reward must have risen since the evaluation it is compared with
FLOOR_SIGNALS = {  # watch_floors key -> (what TRL logs, how a finding names it)
    "entropy": ("entropy", "policy entropy"),
    "completion_length": ("completions/mean_length", "completion length"),
    "signal": ("frac_reward_zero_std", "share of groups whose rewards differ"),
}


@dataclass
class Evaluation:
    """A held-out evaluation of the policy at ``step``: its grade and kind per problem, the adapter if kept."""

    step: int
    grades: dict[int, str]
    kinds: dict[int, str] = field(default_factory=dict)
    adapter: dict[str, torch.Tensor] | None = None

    @property
    def accuracy(self) -> float:
        return sum(g == "correct" for g in self.grades.values()) / max(len(self.grades), 1)


def compare(earlier: Evaluation, later: Evaluation, kind: str | None = None) -> dict | None:
    """``later - earlier`` on the problems both graded (of ``kind``), with its paired interval; None without any."""
    common = sorted(set(earlier.grades) & set(later.grades))
    if kind is not None:
        common = [i for i in common if later.kinds.get(i, earlier.kinds.get(i)) == kind]
    if not common:
        return None
    return paired_gain([earlier.grades[i] for i in common], [later.grades[i] for i in common])


def from_records(step: int, records: list[dict], limit: int | None = None) -> Evaluation:
    """An ``Evaluation`` from per-problem records (``TaskEvaluator.run``'s), the first ``limit`` problems only."""
    kept = [r for r in records if limit is None or r["index"] < limit]
    kinds = {r["index"]: r["kind"] for r in kept if "kind" in r}
    return Evaluation(step, {r["index"]: r["grade"] for r in kept}, kinds)


@dataclass
class Finding:
    kind: str  # collapse, hacking, forgetting, plateau
    step: int  # where it was seen
    since: int  # the step it is measured from
    text: str  # the warning line

    def record(self) -> dict:
        return {"kind": self.kind, "step": self.step, "since": self.since, "text": self.text}


class RunWatch(TrainerCallback):
    """The watch over one run (``args``: an ``HfGRPOConfig``); ``mark(step, record)`` writes a finding into the
    training history (``HistoryCallback.mark``)."""

    def __init__(self, args, mark=None, is_main: bool = True):
        self.stop_on, self.patience = set(args.stop_on or []), args.watch_patience
        self.drop, self.floors = args.watch_reward_drop, dict(args.watch_floors or {})
        self.plateau_evals, self.max_steps = args.watch_plateau_evals, args.max_steps
        self.mark, self.is_main = mark, is_main
        self.rewards: list[tuple[int, float]] = []  # (step, training reward) as logged
        self.streaks: dict[str, int] = {}
        self.findings: list[Finding] = []
        self.evaluations: list[Evaluation] = []
        self.best: Evaluation | None = None  # the most accurate evaluation so far (its adapter copied)
        self.anchor: Evaluation | None = None  # the last evaluation with a gain whose interval is above 0
        self.stopped: dict | None = None  # why the run stopped early, and what it saved
        self._started = time.monotonic()

    # ----------------------------------------------------------------------------------------------------------------
    # Collapse, from what each step logs

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        step = state.global_step
        self.rewards.append((step, float(logs["reward"])))
        means = [self._reward_mean(i) for i in range(len(self.rewards))]  # two-step means, one per logged step
        top = max(range(len(means)), key=means.__getitem__)
        best, current = means[top], means[-1]
        low = current < self.drop * best and best - current >= MIN_REWARD_DROP
        what = f"training reward fell to {current:.3f} from its best {best:.3f} (step {self.rewards[top][0]})"
        self._hold("reward", low, step, self.rewards[top][0], what)
        for key, (logged, name) in FLOOR_SIGNALS.items():
            if key in self.floors and logged in logs:
                value = float(logs[logged])
                value = 1 - value if key == "signal" else value
                floor = self.floors[key]
                self._hold(key, value < floor, step, step, f"{name} {value:.3f} under its floor {floor}")
        if self.findings and "degraded" in self.stop_on and self.stopped is None:
            self._stop(control, step, f"degraded: {self.findings[-1].kind}")

    def _reward_mean(self, i: int) -> float:
        values = [r for _, r in self.rewards[max(0, i - REWARD_WINDOW + 1) : i + 1]]
        return sum(values) / len(values)

    def _hold(self, signal: str, low: bool, step: int, since: int, what: str) -> None:
        """A collapse finding once ``signal`` has been low for ``patience`` logged steps in a row (once a run)."""
        self.streaks[signal] = self.streaks.get(signal, 0) + 1 if low else 0
        seen = any(f.text.startswith(f"collapse ({signal})") for f in self.findings)
        if self.streaks[signal] == self.patience and not seen:
            start = self.rewards[-self.patience][0]
            text = f"collapse ({signal}): {what}, {self.patience} logged steps in a row (steps {start}-{step})"
            self._found("collapse", step, since, text)

    # ----------------------------------------------------------------------------------------------------------------
    # Hacking, forgetting and plateau, from the evaluations

    def evaluated(self, step: int, evaluation: Evaluation, model=None, control=None) -> None:
        """A held-out evaluation at ``step`` (the same problems each time): the rules that read it, and a copy of
        the adapter when it is the most accurate so far."""
        self.evaluations.append(evaluation)
        if self.best is not None:
            self._hacking(self.best, evaluation, "the best evaluation")
            self._forgetting(self.evaluations[0], evaluation)
        if self.best is None or evaluation.accuracy > self.best.accuracy:
            evaluation.adapter = adapter_weights(model)
            if self.best is not None:
                self.best.adapter = None
            self.best = evaluation
        gain = compare(self.anchor, evaluation) if self.anchor is not None else None
        if self.anchor is None or (gain is not None and gain["ci95"][0] > 0):
            self.anchor = evaluation
        stale = [e for e in self.evaluations if e.step > self.anchor.step]
        if len(stale) >= self.plateau_evals and "plateau" in self.stop_on and self.stopped is None:
            since = self.anchor.step
            self._found("plateau", step, since, f"plateau: {len(stale)} evaluations since step {since} gained "
                        f"nothing over its accuracy {self.anchor.accuracy:.3f} (no paired interval above 0)")  # fmt: skip
            self._stop(control, step, "plateau")
        elif self.findings and "degraded" in self.stop_on and self.stopped is None:
            self._stop(control, step, f"degraded: {self.findings[-1].kind}")

    def _reward_since(self, step: int) -> tuple[float, float] | None:
        """(training reward at ``step``: the mean of the first logged steps after it when it is 0, the mean of the
        last ones up to it else; the reward now), or None before two windows were logged."""
        if len(self.rewards) < REWARD_WINDOW:
            return None
        upto = [r for s, r in self.rewards if s <= step][-REWARD_WINDOW:]
        upto = upto or [r for _, r in self.rewards[:REWARD_WINDOW]]  # step 0: the first steps trained
        now = [r for _, r in self.rewards[-REWARD_WINDOW:]]
        return sum(upto) / len(upto), sum(now) / len(now)

    def _hacking(self, earlier: Evaluation, later: Evaluation, what: str) -> None:
        rewards, gain = self._reward_since(earlier.step), compare(earlier, later)
        if rewards is None or gain is None or gain["ci95"][1] >= 0 or rewards[1] < rewards[0] + MIN_REWARD_RISE:
            return
        self._found("hacking", later.step, earlier.step, (
            f"hacking: training reward rose {rewards[0]:.3f} -> {rewards[1]:.3f} while held-out accuracy fell "
            f"{gain['before_accuracy']:.3f} -> {gain['after_accuracy']:.3f} from {what} (step {earlier.step} -> "
            f"{later.step}, {describe(gain)} on the same {gain['n']} problems)"
        ))  # fmt: skip

    def _forgetting(self, first: Evaluation, later: Evaluation) -> None:
        whole = compare(first, later)
        if whole is None or whole["gain"] < 0:
            return
        for kind in sorted(set(later.kinds.values())):
            gain = compare(first, later, kind)
            if gain is None or gain["ci95"][1] >= 0:
                continue
            if any(f.kind == "forgetting" and f"'{kind}'" in f.text for f in self.findings):
                continue
            right = (round(gain["before_accuracy"] * gain["n"]), round(gain["after_accuracy"] * gain["n"]))
            self._found("forgetting", later.step, first.step, (
                f"forgetting: held-out '{kind}' problems fell {right[0]}/{gain['n']} -> {right[1]}/{gain['n']} right "
                f"({describe(gain)}) while the whole rose {whole['before_accuracy']:.3f} -> "
                f"{whole['after_accuracy']:.3f} (step {first.step} -> {later.step})"
            ))  # fmt: skip

    def finished(self, before: Evaluation, after: Evaluation) -> None:
        """The evaluation after training against the one before, on the whole held-out set."""
        self._hacking(before, after, "before training")
        self._forgetting(before, after)

    # ----------------------------------------------------------------------------------------------------------------
    # What the run keeps, and how it reports

    def choose_kept(self, last: Evaluation, model) -> dict | None:
        """Restore the best earlier evaluation's adapter into ``model`` when it beats ``last`` (the state training
        ended in, on the periodic problems) with its paired interval above 0; returns what was kept, or None."""
        best = self.best
        if best is None or best.adapter is None or best.step >= last.step:
            return None
        gain = compare(last, best)
        if gain is None or gain["ci95"][0] <= 0:
            return None
        load_adapter_weights(model, best.adapter)
        kept = {"step": best.step, "accuracy": best.accuracy, "n": gain["n"], "last_step": last.step}
        kept |= {"against_last": {k: gain[k] for k in ("gain", "ci95", "n", "method")}}
        self._say(
            f"watch: keeping the adapter of step {best.step} (held-out accuracy {best.accuracy:.3f}), not "
            f"the last one of step {last.step} ({last.accuracy:.3f}): {describe(gain)} on {gain['n']} problems"
        )
        return kept

    def summary(self) -> dict:
        """What ``eval_results.json`` records of the watch: its findings and why the run stopped."""
        return {"findings": [f.record() for f in self.findings], "stopped": self.stopped}

    def _found(self, kind: str, step: int, since: int, text: str) -> None:
        finding = Finding(kind, step, since, text)
        self.findings.append(finding)
        self._say(f"watch: {text}")
        if self.mark is not None and self.is_main:
            self.mark(step, finding.record())

    def _stop(self, control, step: int, reason: str) -> None:
        if control is None:
            return
        control.should_training_stop = True
        seconds = (time.monotonic() - self._started) / max(step, 1) * max(self.max_steps - step, 0)
        self.stopped = {"reason": reason, "step": step, "steps_saved": max(self.max_steps - step, 0),
                        "seconds_saved": round(seconds)}  # fmt: skip
        saved = self.stopped
        self._say(f"watch: stopping at step {step} ({reason}; stop_on {sorted(self.stop_on)}): {saved['steps_saved']} "
                  f"of max_steps {self.max_steps} not trained, about {saved['seconds_saved']} s saved")  # fmt: skip

    def _say(self, line: str) -> None:
        if self.is_main:
            logger.warning(line)


def describe(gain: dict) -> str:
    """A paired difference in accuracy for a line: ``-28.0 points [-37.0, -19.0], paired``."""
    low, high = gain["ci95"]
    return f"{points(gain['gain'])} points [{points(low)}, {points(high)}], paired"


def adapter_weights(model) -> dict[str, torch.Tensor] | None:
    """A CPU copy of ``model``'s LoRA adapter (PEFT's state dict), None for a model without one (a full fine-tune's
    weights are not copied: the last state is kept) or one sharded across processes (ZeRO-3, FSDP)."""
    from peft import get_peft_model_state_dict

    if model is None or not hasattr(model, "peft_config"):
        return None
    if any(hasattr(p, "ds_id") or p.numel() == 0 for p in model.parameters()):  # ZeRO-3 / FSDP shards: not here
        return None
    return {name: value.detach().to("cpu", copy=True) for name, value in get_peft_model_state_dict(model).items()}


def load_adapter_weights(model, weights: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, weights)
