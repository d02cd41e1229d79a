"""The Markdown of a run's evaluation: the before/after table, the sentence on its paired gain, and ``summary.md``.

The table (``eval_table``) counts correct, answered-but-wrong, no answer found, and grading timed out or failed when
any did, then the paired difference with its 95% interval and the right -> wrong / wrong -> right counts; the model
card shows the same table and sentence.
"""

from __future__ import annotations

import math

from ..results import RunResult
from ..run_files import PLOT_FILE
from .stats import METHOD, points, usable_gain


def gain_interval(gain: dict) -> str:
    """``+3.5 points (95% CI -2.7 to +9.7)``: the paired difference in accuracy points with its interval."""
    low, high = gain["ci95"]
    return f"{points(gain['gain'])} points (95% CI {points(low)} to {points(high)})"


def gain_sentence(gain: dict) -> str:
    """One plain sentence: does the 95% interval of the paired difference exclude zero, and how problems moved."""
    low, high = gain["ci95"]
    n = gain["n"]
    if low > 0 or high < 0:
        verdict = f"excludes zero: on these {n} problems the {'gain' if low > 0 else 'drop'} is unlikely to be noise"
    else:
        verdict = f"includes zero: on these {n} problems the change cannot be told apart from noise"
    moved = f"{gain['wrong_to_right']} went wrong → right, {gain['right_to_wrong']} right → wrong"
    return f"The 95% interval of the difference {verdict} ({moved}; interval: {gain.get('method') or METHOD})."


def eval_table(results: dict, gain: dict | None = None) -> str:
    """The before/after table in Markdown (seed 002's layout: correct, formatted-but-wrong, unparseable).

    Problems whose grading timed out or failed (``timeout`` / ``error``, ``hf_grpo.evaluation.core``) get a row each
    when there are any, before or after.

    With a paired ``gain`` (by default ``results["gain"]`` when it holds one) two rows follow: the difference with its
    95% interval, and the right -> wrong / wrong -> right counts. Without one the table ends at the problem count.
    """
    gain = usable_gain(gain if gain is not None else results.get("gain"), results)
    rows = ["| metric | before | after | change |", "|---|---|---|---|"]
    before, after = results["before"], results["after"]
    b_total, a_total = before["total"] or 1, after["total"] or 1
    rows.append(
        f"| accuracy | {before['accuracy']:.1%} | {after['accuracy']:.1%} | "
        f"{(after['accuracy'] - before['accuracy']) * 100:+.1f} points |"
    )
    kinds = [("correct", "correct"), ("wrong", "answered, wrong"), ("unparseable", "no answer found")]
    for key, label in (("timeout", "grading timed out"), ("error", "grading failed")):
        if before.get(key) or after.get(key):  # only when it happened (results written before they existed lack them)
            kinds.append((key, label))
    for key, label in kinds:
        b, a = before.get(key, 0), after.get(key, 0)
        rows.append(f"| {label} | {b} ({b / b_total:.1%}) | {a} ({a / a_total:.1%}) | {a - b:+d} |")
    rows.append(f"| held-out problems | {before['total']} | {after['total']} | |")
    if gain is not None:
        rows.append(f"| accuracy difference, paired | | | {gain_interval(gain)} |")
        rows.append(
            f"| problems right → wrong / wrong → right | | | {gain['right_to_wrong']} / {gain['wrong_to_right']} |"
        )
    return "\n".join(rows)


def kinds_markdown(kinds: dict[str, dict]) -> list[str]:
    """The held-out accuracy per kind of problem, before and after, with each paired interval, and the kinds that
    fell (their interval below 0) named."""
    if not kinds:
        return []
    lines = ["## By kind of held-out problem", "", "| kind | problems | before | after | difference, paired |"]
    lines.append("|---|---|---|---|---|")
    for kind, gain in kinds.items():
        lines.append(
            f"| {kind} | {gain['n']} | {gain['before_accuracy']:.1%} | {gain['after_accuracy']:.1%} | "
            f"{gain_interval(gain)} |"
        )
    fell = [kind for kind, gain in kinds.items() if gain["ci95"][1] < 0]
    verdict = f"Fell (interval below 0): {', '.join(fell)}." if fell else "No kind fell (no interval below 0)."
    return [*lines, "", verdict, ""]


def watch_markdown(results: dict) -> list[str]:
    """The run watch's findings, why the run stopped early, and which evaluated adapter it kept."""
    watch, kept = results.get("watch") or {}, results.get("kept")
    findings, stopped = watch.get("findings") or [], watch.get("stopped")
    if not watch:
        return []
    lines = ["## Run watch", ""]
    lines += [f"- step {f['step']}: {f['text']}" for f in findings] or ["- no finding"]
    if stopped:
        lines.append(
            f"- stopped at step {stopped['step']} ({stopped['reason']}): {stopped['steps_saved']} steps not trained, "
            f"about {stopped['seconds_saved']} s saved"
        )
    if kept:  # its gain on the problems that chose it is selected (the best of several): no interval is shown
        against, problems = kept["against_last"], results.get("problems") or {}
        changed = against["wrong_to_right"] + against["right_to_wrong"]
        lines.append(
            f"- kept the adapter of step {kept['step']} (held-out accuracy {kept['accuracy']:.1%} on the "
            f"{kept['chosen_on']} problems it was chosen on), not the last one of step {kept['last_step']}: "
            f"{points(against['gain'])} points against it there, {against['wrong_to_right']} of the {changed} that "
            f"changed rose (exact p {against['p']:.2g} <= {against['alpha']:.2g}); the evaluation after training "
            f"above is the kept adapter's, on the {problems.get('judged', '?')} other problems"
        )
    return [*lines, ""]


def _num(value) -> str:
    """A logged number to 3 decimals; ``n/a`` for one that is missing or not finite (a batch no reward could score)."""
    return f"{value:.3f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def summary_markdown(run: RunResult) -> str:
    """A Markdown summary of the run: held-out before/after table, training facts, the plot."""
    history = run.history
    lines = [f"# Training summary: {run.output_dir.name}", ""]
    if run.has_eval:
        lines += ["## Held-out accuracy (greedy)", "", eval_table(run.evaluations, run.gain), ""]
        if run.gain is not None:
            lines += [gain_sentence(run.gain), ""]
        lines += kinds_markdown(run.evaluations.get("kinds") or {})
    lines += watch_markdown(run.evaluations or {})
    logged = [r for r in history if "reward" in r]
    if logged:
        last = logged[-1]
        runtime = next((r["train_runtime"] for r in reversed(history) if "train_runtime" in r), None)
        lines += ["## Training", "", f"- optimizer steps: {last['step']}"]
        if runtime is not None:
            lines.append(f"- training time: {runtime:.0f} s")
        lines.append(f"- reward: {_num(logged[0]['reward'])} (first log) -> {_num(last['reward'])} (last log)")
        if "accuracy" in last:
            lines.append(f"- train accuracy (sampled): {_num(logged[0].get('accuracy'))} -> {_num(last['accuracy'])}")
        if "dynamic_sampling/kept_fraction" in last:
            kept = [r["dynamic_sampling/kept_fraction"] for r in logged if "dynamic_sampling/kept_fraction" in r]
            lines.append(f"- dynamic sampling: {sum(kept) / len(kept):.0%} of generated groups kept on average")
        lines.append("")
    if (run.output_dir / PLOT_FILE).is_file():
        lines += [f"![training curves]({PLOT_FILE})", ""]
    return "\n".join(lines)
