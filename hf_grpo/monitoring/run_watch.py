"""The run watch: a ``TrainerCallback`` that reads what a run logs and its held-out evaluations and says when the
run goes wrong (collapse, hacking, forgetting, plateau), can stop it (``stop_on``) and keeps its best adapter
(``choose_kept``). Every rule on held-out accuracy compares an evaluation with step 0 (the policy training starts
from) by McNemar's exact one-sided test; ``Budget`` splits the run's false-alarm rate (``FALSE_ALARM_RATE``) over
the rules, the planned evaluations and the kinds (Bonferroni). Its state goes into every checkpoint and into
``output_dir`` (``save_state``). The rules and their numbers: docs/watch.md; the error rate: benchmarks/watch_null.py.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

from ..base.run_files import WATCH_ADAPTER, WATCH_STATE, RunFileError, read_checked, write_text
from ..evaluation.stats import one_sided_p, paired_gain, points


logger = logging.getLogger(__name__)

FALSE_ALARM_RATE = 0.05  # the share of runs with no change in held-out accuracy that get a finding on it
KEEP_ERROR_RATE = 0.05  # the share of such runs that keep an earlier adapter instead of the last
REWARD_WINDOW = 2  # logged steps averaged into the reward the rules compare
MIN_REWARD_DROP = 0.1  # a collapse of the reward is also this far below its best (a reward near 0 wobbles)
MIN_REWARD_RISE = 0.05  # hacking: how much the reward must have risen since step 0
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

    def record(self) -> dict:
        return {"step": self.step, "grades": {str(i): g for i, g in self.grades.items()},
                "kinds": {str(i): k for i, k in self.kinds.items()}}  # fmt: skip

    @classmethod
    def from_record(cls, record: dict) -> Evaluation:
        kinds = {int(i): k for i, k in record.get("kinds", {}).items()}
        return cls(int(record["step"]), {int(i): g for i, g in record["grades"].items()}, kinds)


def compare(
    earlier: Evaluation, later: Evaluation, kind: str | None = None, exclude: str | None = None
) -> dict | None:
    """``later - earlier`` on the problems both graded (of ``kind``, or of every kind but ``exclude``), with its
    paired interval; None without any."""
    common = sorted(set(earlier.grades) & set(later.grades))
    if kind is not None or exclude is not None:
        kinds = {i: later.kinds.get(i, earlier.kinds.get(i)) for i in common}
        common = [i for i in common if (kind is None or kinds[i] == kind) and (exclude is None or kinds[i] != exclude)]
    if not common:
        return None
    return paired_gain([earlier.grades[i] for i in common], [later.grades[i] for i in common])


def from_records(step: int, records: list[dict], limit: int | None = None, start: int = 0) -> Evaluation:
    """An ``Evaluation`` from per-problem records (``TaskEvaluator.run``'s), those with ``start <= index < limit``."""
    kept = [r for r in records if r["index"] >= start and (limit is None or r["index"] < limit)]
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


@dataclass(frozen=True)
class Budget:
    """How a run spends ``FALSE_ALARM_RATE``: equal parts to each rule it looks for (hacking; forgetting with two
    kinds or more; the gain a plateau needs first, with ``stop_on: [plateau]``); a rule's part half to the look after
    training (every problem) and half shared by the planned periodic evaluations (all of it to one kind of look when
    there is only one); forgetting's share of a look split over the kinds."""

    looks: int  # periodic evaluations planned: max_steps // task_eval_steps
    kinds: int  # kinds of held-out problem
    plateau: bool

    @property
    def rules(self) -> tuple[str, ...]:
        return ("hacking", *(["forgetting"] if self.kinds >= 2 else []), *(["gain"] if self.plateau else []))

    def share(self, rule: str, final: bool = False) -> float:
        """The false-alarm rate one test of ``rule`` may spend (at the look after training when ``final``)."""
        if rule not in self.rules:
            return 0.0
        part = FALSE_ALARM_RATE / len(self.rules)
        if rule == "gain":  # only the periodic evaluations look for a plateau
            part = 0.0 if final else part / max(self.looks, 1)
        elif self.looks:
            part = part / 2 if final else part / 2 / self.looks
        elif not final:
            part = 0.0
        return part / self.kinds if rule == "forgetting" else part


def tested(gain: dict, direction: str, alpha: float) -> str | None:
    """The line's account of a comparison that passes its test at ``alpha``, or None when it does not:
    ``-30.0 points on the same 100 problems: 30 of the 30 that changed fell, exact p 9.3e-10 <= 0.0031``."""
    p = one_sided_p(gain, direction)
    if p > alpha:
        return None
    moved = gain["right_to_wrong"] if direction == "fell" else gain["wrong_to_right"]
    changed = gain["right_to_wrong"] + gain["wrong_to_right"]
    return (f"{points(gain['gain'])} points on the same {gain['n']} problems: {moved} of the {changed} that changed "
            f"{direction}, exact p {p:.2g} <= {alpha:.2g}")  # fmt: skip


class RunWatch(TrainerCallback):
    """The watch over one run (``args``: an ``HfGRPOConfig``); ``mark(step, record)`` writes a finding into the
    training history (``HistoryCallback.mark``). ``judge_apart``: the held-out set has problems beyond the periodic
    ones, on which an earlier adapter the run keeps is judged (else the last state is always kept)."""

    def __init__(self, args, mark=None, is_main: bool = True, judge_apart: bool = True):
        self.stop_on, self.patience = set(args.stop_on or []), args.watch_patience
        self.drop, self.floors = args.watch_reward_drop, dict(args.watch_floors or {})
        self.plateau_evals, self.max_steps = args.watch_plateau_evals, args.max_steps
        self.task_eval_steps, self.final_look = args.task_eval_steps, getattr(args, "eval_before_after", True)
        self.mark, self.is_main, self.judge_apart = mark, is_main, judge_apart
        self.rewards: list[tuple[int, float]] = []  # (step, training reward) as logged
        self.streaks: dict[str, int] = {}
        self.findings: list[Finding] = []
        self.evaluations: list[Evaluation] = []  # step 0 first, then the periodic ones
        self.best: Evaluation | None = None  # the most accurate evaluation so far (its adapter copied)
        self.gained: Evaluation | None = None  # the last evaluation whose gain passed its test (plateau)
        self.stopped: dict | None = None  # why the run stopped early, and what it saved
        self._started = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.max_steps > 0:  # epochs-based runs know their steps once training starts
            self.max_steps = state.max_steps

    def budget(self, kinds_of: Evaluation | None = None) -> Budget:
        """The run's plan: a periodic evaluation every ``task_eval_steps``, but at the last step when the look after
        training takes its place."""
        last = self.max_steps - 1 if self.final_look else self.max_steps
        looks = last // self.task_eval_steps if self.task_eval_steps > 0 and self.max_steps > 0 else 0
        reference = self.evaluations[0] if self.evaluations else kinds_of
        kinds = len(set(reference.kinds.values())) if reference is not None else 0
        return Budget(looks, kinds, "plateau" in self.stop_on)

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
        """A held-out evaluation at ``step`` (the periodic problems; the first one is step 0): the rules that read
        it, and a copy of the adapter when it is the most accurate so far."""
        self.evaluations.append(evaluation)
        if self.best is None or evaluation.accuracy > self.best.accuracy:
            evaluation.adapter = adapter_weights(model)
            if self.best is not None:
                self.best.adapter = None
            self.best = evaluation
        if len(self.evaluations) == 1:  # step 0: the reference of every later look
            return
        start, budget = self.evaluations[0], self.budget()
        self._hacking(start, evaluation, budget.share("hacking"))
        self._forgetting(start, evaluation, budget.share("forgetting"))
        if "plateau" in self.stop_on:
            self._plateau(start, evaluation, budget.share("gain"), control)
        if self.findings and "degraded" in self.stop_on and self.stopped is None:
            self._stop(control, step, f"degraded: {self.findings[-1].kind}")

    def _plateau(self, start: Evaluation, evaluation: Evaluation, alpha: float, control) -> None:
        """A plateau once the run gained over step 0 (its test passed) and the last ``plateau_evals`` evaluations
        gained nothing over the last gain; a run that never gained is no plateau (its report says so)."""
        since = self.gained or start
        gain = compare(since, evaluation)
        account = tested(gain, "rose", alpha) if gain is not None else None
        if account is not None:
            self.gained = evaluation
            return
        stale = [e for e in self.evaluations if self.gained is not None and e.step > self.gained.step]
        if len(stale) < self.plateau_evals or self.stopped is not None:
            return
        gained = self.gained
        self._found("plateau", evaluation.step, gained.step, (
            f"plateau: held-out accuracy rose {start.accuracy:.3f} -> {gained.accuracy:.3f} by step {gained.step}, "
            f"then {len(stale)} evaluations gained nothing more"
        ))  # fmt: skip
        self._stop(control, evaluation.step, "plateau")

    def _reward_since(self, step: int) -> tuple[float, float] | None:
        """(training reward at ``step``: the mean of the first logged steps after it when it is 0, the mean of the
        last ones up to it else; the reward now), or None before two windows were logged."""
        if len(self.rewards) < REWARD_WINDOW:
            return None
        upto = [r for s, r in self.rewards if s <= step][-REWARD_WINDOW:]
        upto = upto or [r for _, r in self.rewards[:REWARD_WINDOW]]  # step 0: the first steps trained
        now = [r for _, r in self.rewards[-REWARD_WINDOW:]]
        return sum(upto) / len(upto), sum(now) / len(now)

    def _hacking(self, start: Evaluation, later: Evaluation, alpha: float) -> None:
        if any(f.kind == "hacking" for f in self.findings):
            return
        rewards, gain = self._reward_since(start.step), compare(start, later)
        if rewards is None or gain is None or rewards[1] < rewards[0] + MIN_REWARD_RISE:
            return
        account = tested(gain, "fell", alpha)
        if account is None:
            return
        self._found("hacking", later.step, start.step, (
            f"hacking: training reward rose {rewards[0]:.3f} -> {rewards[1]:.3f} while held-out accuracy fell "
            f"{gain['before_accuracy']:.3f} -> {gain['after_accuracy']:.3f} (step {start.step} -> {later.step}, "
            f"{account})"
        ))  # fmt: skip

    def _forgetting(self, start: Evaluation, later: Evaluation, alpha: float) -> None:
        """A kind that fell (its test passed) while the other kinds together did not fall."""
        for kind in sorted(set(later.kinds.values())):
            if any(f.kind == "forgetting" and f"'{kind}'" in f.text for f in self.findings):
                continue
            gain = compare(start, later, kind)
            account = tested(gain, "fell", alpha) if gain is not None else None
            rest = compare(start, later, exclude=kind) if account is not None else None
            if rest is None or rest["gain"] < 0:
                continue
            right = (round(gain["before_accuracy"] * gain["n"]), round(gain["after_accuracy"] * gain["n"]))
            self._found("forgetting", later.step, start.step, (
                f"forgetting: held-out '{kind}' problems fell {right[0]}/{gain['n']} -> {right[1]}/{gain['n']} right "
                f"({account}) while the other kinds went {rest['before_accuracy']:.3f} -> {rest['after_accuracy']:.3f} "
                f"(step {start.step} -> {later.step})"
            ))  # fmt: skip

    def finished(self, start: Evaluation, after: Evaluation) -> None:
        """The look after training: the evaluation after it against step 0's, on every held-out problem."""
        budget = self.budget(kinds_of=start)
        self._hacking(start, after, budget.share("hacking", final=True))
        self._forgetting(start, after, budget.share("forgetting", final=True))

    # ----------------------------------------------------------------------------------------------------------------
    # What the run keeps, and how it reports

    def choose_kept(self, last: Evaluation) -> dict | None:
        """What to keep instead of the state training ended in (``last``, on the periodic problems): the most
        accurate earlier evaluation when it beats ``last`` by the exact test at ``KEEP_ERROR_RATE`` over the
        evaluations it was the best of, and the held-out set has problems left to judge it on; else None.
        ``restore`` then puts its adapter into the model."""
        best, earlier = self.best, [e for e in self.evaluations if e.step < last.step]
        if best is None or best.adapter is None or best.step >= last.step or not earlier:
            return None
        gain = compare(last, best)
        alpha = KEEP_ERROR_RATE / len(earlier)
        account = tested(gain, "rose", alpha) if gain is not None else None
        if account is None:
            return None
        if not self.judge_apart:
            self._say(
                f"watch: the adapter of step {best.step} beats the last one ({account}), but every held-out problem "
                "chose it (task_eval_max_samples covers the held-out set), so none is left to judge it on: the last "
                "state is kept; set task_eval_max_samples below the held-out size to let the watch keep an adapter"
            )
            return None
        self._say(
            f"watch: keeping the adapter of step {best.step} (held-out accuracy {best.accuracy:.3f}), not the last "
            f"one of step {last.step} ({last.accuracy:.3f}): {account}"
        )
        against = {k: gain[k] for k in ("gain", "n", "right_to_wrong", "wrong_to_right")}
        return {"step": best.step, "accuracy": best.accuracy, "chosen_on": gain["n"], "last_step": last.step,
                "against_last": {**against, "p": one_sided_p(gain, "rose"), "alpha": alpha}}  # fmt: skip

    def restore(self, model) -> None:
        """The kept (best) adapter's weights into ``model``."""
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, self.best.adapter)

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

    # ----------------------------------------------------------------------------------------------------------------
    # Its state, in checkpoints and in output_dir

    def save_state(self, folder: str | Path) -> None:
        """Write the watch's state into ``folder`` (``WATCH_STATE``, and ``WATCH_ADAPTER`` for its best adapter),
        each by temp file and rename; the main process only."""
        from safetensors.torch import save_file

        folder = Path(folder)
        state = {"rewards": self.rewards, "streaks": self.streaks, "findings": [f.record() for f in self.findings],
                 "evaluations": [e.record() for e in self.evaluations], "stopped": self.stopped,
                 "best": self._index(self.best), "gained": self._index(self.gained)}  # fmt: skip
        if self.best is not None and self.best.adapter is not None:
            tmp = folder / f".{WATCH_ADAPTER}.tmp"
            save_file({k: v.contiguous() for k, v in self.best.adapter.items()}, str(tmp))
            tmp.replace(folder / WATCH_ADAPTER)
        else:  # an earlier training's copy in this folder is not this run's best
            (folder / WATCH_ADAPTER).unlink(missing_ok=True)
        write_text(folder / WATCH_STATE, json.dumps(state) + "\n")

    def load_state(self, folder: str | Path) -> bool:
        """The state ``save_state`` wrote into ``folder``; False (and the watch as it was) when there is none;
        ``RunFileError`` naming the file when it is damaged."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(folder) / WATCH_STATE
        state = read_checked(path, dict, missing_ok=True)
        if state is None:
            return False
        try:
            rewards = [(int(s), float(r)) for s, r in state["rewards"]]
            findings = [Finding(**f) for f in state["findings"]]
            evaluations = [Evaluation.from_record(e) for e in state["evaluations"]]
            best, gained = (None if state[k] is None else evaluations[state[k]] for k in ("best", "gained"))
            streaks, stopped = dict(state["streaks"]), state["stopped"]
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise RunFileError(f"{path} is not the run watch's state hf_grpo wrote ({exc!r}): remove it") from None
        adapter = Path(folder) / WATCH_ADAPTER
        if best is not None and adapter.is_file():
            try:
                best.adapter = load_file(str(adapter))
            except (OSError, SafetensorError) as exc:
                raise RunFileError(f"{adapter} cannot be read ({exc}): remove it") from None
        self.rewards, self.findings, self.evaluations, self.streaks, self.stopped = (
            rewards,
            findings,
            evaluations,
            streaks,
            stopped,
        )
        self.best, self.gained = best, gained
        return True

    def _index(self, evaluation: Evaluation | None) -> int | None:
        return None if evaluation is None else next(i for i, e in enumerate(self.evaluations) if e is evaluation)


def adapter_weights(model) -> dict[str, torch.Tensor] | None:
    """A CPU copy of ``model``'s LoRA adapter (PEFT's state dict), None for a model without one (a full fine-tune's
    weights are not copied: the last state is kept) or one sharded across processes (ZeRO-3, FSDP)."""
    from peft import get_peft_model_state_dict

    if model is None or not hasattr(model, "peft_config"):
        return None
    if any(hasattr(p, "ds_id") or p.numel() == 0 for p in model.parameters()):  # ZeRO-3 / FSDP shards: not here
        return None
    return {name: value.detach().to("cpu", copy=True) for name, value in get_peft_model_state_dict(model).items()}
