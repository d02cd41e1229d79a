"""The Markdown of a run's evaluation: the held-out table, the sentences on its paired gains, and ``summary.md``.

The table (``eval_table``) counts correct, answered-but-wrong, no answer found, and grading timed out or failed when
any did, before training, after a warm start when the run had one, and after; then each step's paired difference
with its 95% interval and the right -> wrong / wrong -> right counts; the model card shows the same table and
sentences.
"""

from __future__ import annotations

import math

from ..base.run_files import PLOT_FILE
from ..evaluation.stats import METHOD, points, usable_gain
from .run_result import RunResult


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


STEP_LABELS = {"before": "before", "warm_start": "after the warm start", "after": "after"}


def gain_sentences(results: dict, gain: dict) -> str:
    """``gain_sentence`` of the whole gain, and with a warm start the same of GRPO's own part (after against the
    warm-started policy): what the warm start bought is not credited to GRPO."""
    grpo = (results.get("gains") or {}).get("grpo")
    own = f" For GRPO's own part (after against the warm-started policy), t{gain_sentence(grpo)[1:]}" if grpo else ""
    return gain_sentence(gain) + own


def eval_table(results: dict, gain: dict | None = None) -> str:
    """The held-out table in Markdown (seed 002's layout: correct, formatted-but-wrong, unparseable): before, after
    a pretrained policy's warm start when the run had one, after; and the change.

    Problems whose grading timed out or failed (``timeout`` / ``error``, ``hf_grpo.evaluation.core``) get a row each
    when there are any. With a paired ``gain`` (by default ``results["gain"]``) two rows follow: the difference with
    its 95% interval and the right -> wrong / wrong -> right counts, under each evaluation the step leads to (with a
    warm start: the warm start's, GRPO's own, the whole). Without one the table ends at the problem count.
    """
    gain = usable_gain(gain if gain is not None else results.get("gain"), results)
    labels = [label for label in STEP_LABELS if isinstance(results.get(label), dict)]
    columns = [results[label] for label in labels]
    rows = ["| metric | " + " | ".join(STEP_LABELS[label] for label in labels) + " | change |"]
    rows.append("|---" * (len(labels) + 2) + "|")
    first, last = columns[0], columns[-1]
    accuracies = " | ".join(f"{c['accuracy']:.1%}" for c in columns)
    rows.append(f"| accuracy | {accuracies} | {(last['accuracy'] - first['accuracy']) * 100:+.1f} points |")
    kinds = [("correct", "correct"), ("wrong", "answered, wrong"), ("unparseable", "no answer found")]
    for key, label in (("timeout", "grading timed out"), ("error", "grading failed")):
        if any(c.get(key) for c in columns):  # only when it happened (results written before they existed lack them)
            kinds.append((key, label))
    for key, label in kinds:
        cells = " | ".join(f"{c.get(key, 0)} ({c.get(key, 0) / (c['total'] or 1):.1%})" for c in columns)
        rows.append(f"| {label} | {cells} | {last.get(key, 0) - first.get(key, 0):+d} |")
    rows.append("| held-out problems | " + " | ".join(str(c["total"]) for c in columns) + " | |")
    if gain is not None:
        steps = results.get("gains") if "warm_start" in labels else None
        named = [("warm start", steps["warm_start"]), ("GRPO", steps["grpo"])] if steps else []
        named.append(("whole" if named else "", gain))
        blank = [""] * (len(labels) + 1 - len(named))  # each difference under the evaluation it leads to
        cells = blank + [f"{name}: {gain_interval(g)}".lstrip(": ") for name, g in named]
        moved = blank + [f"{g['right_to_wrong']} / {g['wrong_to_right']}" for _, g in named]
        rows.append(_row("accuracy difference, paired", cells))
        rows.append(_row("problems right → wrong / wrong → right", moved))
    return "\n".join(rows)


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} |" + "".join(f" {cell} |" if cell else " |" for cell in cells)


def kinds_markdown(kinds: dict[str, dict], by_step: dict | None = None) -> list[str]:
    """The held-out accuracy per kind of problem, before and after (and after a warm start, with GRPO's own
    difference, when ``by_step`` holds it), with each paired interval, and the kinds that fell (whole interval
    below 0) named."""
    if not kinds:
        return []
    grpo = (by_step or {}).get("grpo") or {}
    if grpo:
        header = (
            "| kind | problems | before | after the warm start | after | GRPO's difference, paired | whole, paired |"
        )
        lines = ["## By kind of held-out problem", "", header, "|---|---|---|---|---|---|---|"]
    else:
        lines = ["## By kind of held-out problem", "", "| kind | problems | before | after | difference, paired |"]
        lines.append("|---|---|---|---|---|")
    for kind, gain in kinds.items():
        middle = f"{grpo[kind]['before_accuracy']:.1%} | " if kind in grpo else ""
        own = f" {gain_interval(grpo[kind])} |" if kind in grpo else ""
        lines.append(
            f"| {kind} | {gain['n']} | {gain['before_accuracy']:.1%} | {middle}{gain['after_accuracy']:.1%} |{own} "
            f"{gain_interval(gain)} |"
        )
    fell = [kind for kind, gain in kinds.items() if gain["ci95"][1] < 0]
    verdict = f"Fell (interval below 0): {', '.join(fell)}." if fell else "No kind fell (no interval below 0)."
    return [*lines, "", verdict, ""]


def judged_sentence(results: dict) -> list[str]:
    """When the watch kept an earlier adapter: the problems that judge it (the others chose it)."""
    problems = results.get("problems")
    if not problems:
        return []
    sentence = (f"Every number here is on the {problems['judged']} held-out problems that did not choose the adapter "
                f"the run kept; the first {problems['chose_the_adapter']} chose it (Run watch, below).")  # fmt: skip
    return [sentence, ""]


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
        lines += judged_sentence(run.evaluations)
        if run.gain is not None:
            lines += [gain_sentences(run.evaluations, run.gain), ""]
        lines += kinds_markdown(run.evaluations.get("kinds") or {}, run.evaluations.get("kinds_by_step"))
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
