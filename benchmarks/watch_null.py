"""The run watch on simulated runs: how often it finds something in runs whose held-out accuracy does not change, and
how often and how soon it finds a real effect (issue 68).

Each run feeds the real ``hf_grpo.monitoring.run_watch.RunWatch`` what a training run feeds it: a training reward logged every
``logging_steps`` that rises from 0.2 to 0.8 (with noise), step 0's evaluation, a periodic evaluation every
``task_eval_steps`` on the first ``task_eval_max_samples`` problems, the look after training on every problem, and the
choice of the adapter to keep. Each problem has its own chance of being solved, drawn once per run from Beta(0.7, 1)
(accuracy about 0.41); between two evaluations the weights move, so each problem is graded again with chance ``rate``
(else it keeps its grade: greedy decoding of nearly the same weights). Under the null those chances never change.

Printed per shape and rate: the share of runs with each finding (hacking, forgetting, plateau when ``stop_on:
[plateau]``), with any of them, and that keep an earlier adapter, and the mean gain reported for a kept adapter: on
the problems that did not choose it, by ``hf_grpo.run.phases.reported`` as a run computes it (under the null it should
be 0). The effects: the whole set's accuracy falls 10 points by the end of the run while the reward rises (hacking
should be found), and one kind falls 30 points while the others rise so that the whole holds (forgetting should be
found); printed, how often and at which step on average.

    python benchmarks/watch_null.py                # every shape, 2000 runs a row (about 10 minutes on 2 cores)
    python benchmarks/watch_null.py --runs 400 --shapes smollm2-135m-arith
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from hf_grpo.monitoring.run_watch import Evaluation, RunWatch
from hf_grpo.run.phases import reported


@dataclass(frozen=True)
class Shape:
    """How a recipe evaluates: held-out problems, periodic ones, steps, every how many, kinds, logging."""

    held_out: int
    periodic: int
    max_steps: int
    every: int
    kinds: int
    logging_steps: int = 1


# From the shipped recipes (held-out sizes of hub data from their cards: GSM8K test 1319, MATH-500 500; the 0.1% split
# of OpenMathInstruct-2's 14M rows is capped here at 2000: only its periodic 200 and the last look read it).
SHAPES = {
    "tiny": Shape(500, 500, 40, 10, 0, 5),
    "smollm2-135m-arith": Shape(300, 50, 12, 6, 6),
    "smollm2-135m-reasoning": Shape(300, 50, 12, 5, 6),
    "qwen7b-lora-dedicated": Shape(2000, 200, 100, 10, 0),
    "qwen7b (no periodic)": Shape(1319, 1319, 500, 0, 0, 5),
    "gpu, 100 steps": Shape(300, 200, 100, 10, 6),
    "gpu, 300 steps": Shape(300, 200, 300, 10, 6),
}
RATES = (0.1, 0.3, 1.0)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)


def tiny_adapter_model():
    """A LoRA model small enough that the watch's adapter copies cost nothing."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(_Net(), LoraConfig(r=1, target_modules=["lin"]))


def watch_args(shape: Shape, stop_on: list[str]) -> SimpleNamespace:
    return SimpleNamespace(stop_on=stop_on, watch_patience=2, watch_reward_drop=0.5, watch_floors=None,
                           watch_plateau_evals=3, max_steps=shape.max_steps, task_eval_steps=shape.every)  # fmt: skip


def chances(rng, shape: Shape, effect: str | None, progress: float, base: np.ndarray, kinds: np.ndarray):
    """Each problem's chance of being solved at ``progress`` (0 to 1) through the run."""
    if effect == "hacking":  # the whole falls 10 points by the end
        return base * (1 - progress * 0.10 / base.mean())
    if effect == "forgetting":  # kind 0 falls 30 points, the others rise so that the whole holds
        fell = kinds == 0
        p = base.copy()
        p[fell] = base[fell] * (1 - progress * min(0.30 / base[fell].mean(), 1.0))
        lost = (base[fell] - p[fell]).sum()
        p[~fell] = np.minimum(base[~fell] + lost / (~fell).sum(), 1.0)
        return p
    return base


def regrade(rng, grades: np.ndarray, p_then: np.ndarray, p_now: np.ndarray, rate: float) -> np.ndarray:
    """The grades at the next evaluation: graded again with chance ``rate`` (from ``p_now``), else kept, a right
    answer kept with chance p_now / p_then (so each problem's chance of being right is p_now)."""
    again = rng.random(grades.size) < rate
    keep_right = rng.random(grades.size) < np.divide(p_now, p_then, out=np.ones_like(p_now), where=p_then > 0)
    kept = grades & (keep_right | (p_now >= p_then))
    rising = ~grades & (p_now > p_then) & (rng.random(grades.size) < (p_now - p_then) / np.maximum(1 - p_then, 1e-9))
    return np.where(again, rng.random(grades.size) < p_now, kept | rising)


def as_evaluation(step: int, grades: np.ndarray, kinds: np.ndarray, limit: int, has_kinds: bool) -> Evaluation:
    named = {i: ("correct" if grades[i] else "wrong") for i in range(limit)}
    return Evaluation(step, named, {i: f"k{kinds[i]}" for i in range(limit)} if has_kinds else {})


def records(grades: np.ndarray, kinds: np.ndarray, has_kinds: bool) -> list[dict]:
    return [{"index": i, "grade": "correct" if g else "wrong", **({"kind": f"k{kinds[i]}"} if has_kinds else {})}
            for i, g in enumerate(grades)]  # fmt: skip


def simulate(shape: Shape, rate: float, rng, model, effect: str | None = None, stop_on=()) -> dict:
    """One run through the real RunWatch; what it found, when, and what it kept."""
    n, k = shape.held_out, max(shape.kinds, 1)
    kinds, has_kinds = np.arange(n) % k, shape.kinds >= 2
    base = rng.beta(0.7, 1.0, n)
    grades = rng.random(n) < base
    watch = RunWatch(watch_args(shape, list(stop_on)), is_main=True, judge_apart=shape.periodic < n)
    control = SimpleNamespace(should_training_stop=False)
    start, kept_grades, p_then, step = grades.copy(), {0: grades.copy()}, base, 0
    if shape.every:
        watch.evaluated(0, as_evaluation(0, grades, kinds, shape.periodic, has_kinds), model, control)
    for step in range(1, shape.max_steps + 1):
        if step % shape.logging_steps == 0:
            reward = 0.2 + 0.6 * step / shape.max_steps + rng.normal(0, 0.05)
            watch.on_log(None, SimpleNamespace(global_step=step), control, logs={"reward": reward})
        if shape.every and step % shape.every == 0 and step < shape.max_steps:  # the last: the look after training
            p_now = chances(rng, shape, effect, step / shape.max_steps, base, kinds)
            grades, p_then = regrade(rng, grades, p_then, p_now, rate), p_now
            kept_grades[step] = grades.copy()
            watch.evaluated(step, as_evaluation(step, grades, kinds, shape.periodic, has_kinds), model, control)
        if control.should_training_stop:
            break
    if step not in kept_grades:  # the last state: one more move of the weights since the last evaluation
        p_now = chances(rng, shape, effect, step / shape.max_steps, base, kinds)
        grades, p_then = regrade(rng, grades, p_then, p_now, rate), p_now
        kept_grades[step] = grades.copy()
    after = kept_grades[step]
    watch.finished(as_evaluation(0, start, kinds, n, has_kinds), as_evaluation(step, after, kinds, n, has_kinds))
    kept = watch.choose_kept(as_evaluation(step, after, kinds, shape.periodic, has_kinds))
    final = after if kept is None else kept_grades[kept["step"]]
    report = reported({"before": records(start, kinds, has_kinds), "after": records(final, kinds, has_kinds)},
                      shape.periodic if kept is not None else 0)  # fmt: skip
    found = {}
    for finding in watch.findings:
        found.setdefault(finding.kind, finding.step)
    return {"found": found, "kept": kept is not None, "gain": report["gain"]["gain"]}


def null_row(name: str, shape: Shape, rate: float, runs: int, seed: int, model, stop_on=()) -> tuple[str, list]:
    rng = np.random.default_rng(seed)
    results = [simulate(shape, rate, rng, model, stop_on=stop_on) for _ in range(runs)]
    share = lambda kind: sum(kind in r["found"] for r in results) / runs  # noqa: E731
    anyone = sum(any(k in r["found"] for k in ("hacking", "forgetting", "plateau")) for r in results) / runs
    kept = [r for r in results if r["kept"]]
    gains = np.array([r["gain"] for r in kept]) * 100
    se = gains.std(ddof=1) / np.sqrt(len(gains)) if len(gains) > 1 else float("nan")
    kept_gain = f"{gains.mean():+.2f} ± {se:.2f} ({len(gains)} runs)" if kept else "n/a"
    last_gain = np.mean([r["gain"] for r in results if not r["kept"]]) * 100
    plateau = f"{share('plateau'):6.1%}" if "plateau" in stop_on else "     -"
    return ((f"| {name} | {rate:.1f} | {share('hacking'):6.1%} | {share('forgetting'):6.1%} | {plateau} | "
            f"{anyone:6.1%} | {share('collapse'):6.1%} | {len(kept) / runs:6.1%} | {kept_gain} | {last_gain:+.2f} |"),
            list(gains))  # fmt: skip


def effect_row(name: str, shape: Shape, rate: float, effect: str, runs: int, seed: int, model) -> str:
    rng = np.random.default_rng(seed)
    results = [simulate(shape, rate, rng, model, effect=effect) for _ in range(runs)]
    steps = [r["found"][effect] for r in results if effect in r["found"]]
    when = f"{np.mean(steps):.1f}" if steps else "-"
    wrong = "forgetting" if effect == "hacking" else "hacking"
    other = sum(wrong in r["found"] for r in results) / runs
    return f"| {name} | {rate:.1f} | {effect} | {len(steps) / runs:6.1%} | {when} | {other:6.1%} ({wrong}) |"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="simulated runs per row")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rates", nargs="*", type=float, default=list(RATES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.getLogger("hf_grpo.monitoring.run_watch").setLevel(logging.ERROR)  # its findings are counted, not printed
    model, start = tiny_adapter_model(), time.perf_counter()
    print(f"{args.runs} simulated runs a row, the real hf_grpo.monitoring.run_watch.RunWatch; rate: the chance a problem is graded "
          "again between two evaluations\n")  # fmt: skip
    print(
        "Null (held-out accuracy never changes; the reward rises). Findings: share of runs; kept: an earlier "
        "adapter kept; gains in points, kept adapter on the problems that did not choose it, last state on all\n"
    )
    print(
        "| shape | rate | hacking | forgetting | plateau | any of the three | collapse | kept earlier | "
        "kept's mean gain | last's mean gain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    pooled = []
    for name in args.shapes:
        shape = SHAPES[name]
        rows = [(name, rate, ()) for rate in args.rates]
        rows += [(f"{name}, stop_on plateau", args.rates[-1], ("plateau",))] if shape.every else []
        for label, rate, stop_on in rows:
            line, gains = null_row(label, shape, rate, args.runs, args.seed, model, stop_on=stop_on)
            pooled += gains
            print(line, flush=True)
    if len(pooled) > 1:
        mean, se = np.mean(pooled), np.std(pooled, ddof=1) / np.sqrt(len(pooled))
        print(f"\nEvery null row: {len(pooled)} runs kept an earlier adapter; the gain reported for it, on the problems "
              f"that did not choose it: {mean:+.2f} ± {se:.2f} points (mean ± standard error)")  # fmt: skip
    print("\nReal effects: hacking = the whole set falls 10 points by the end while the reward rises; forgetting = one "
          "kind falls 30 points while the others rise (the whole holds)\n")  # fmt: skip
    print("| shape | rate | effect | found | mean step found | other finding |")
    print("|---|---|---|---|---|---|")
    for name in args.shapes:
        shape = SHAPES[name]
        for effect in ("hacking", "forgetting") if shape.kinds >= 2 else ("hacking",):
            print(effect_row(name, shape, 0.3, effect, max(args.runs // 4, 50), args.seed + 1, model), flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
