"""Training report: seed 002's four-panel plot and a Markdown summary with the before/after table.

Panels: (1) mean reward per step, (2) train accuracy vs held-out accuracy, with the before -> after difference and
its paired 95% interval, (3) loss, (4) the reward's min/max band with its mean. ``summary.md`` holds the before/after
table (correct, answered-but-wrong, no answer found, grading timed out or failed when any did, the paired difference
with its 95% interval and the right -> wrong / wrong -> right counts), a sentence saying whether that interval
excludes zero, and the training facts. Everything is read from ``training_history.json``, ``eval_results.json``
and, when ``eval_results.json`` holds no ``gain``, the per-problem ``eval_before.jsonl`` / ``eval_after.jsonl``
(``hf_grpo.evaluation.stats``), so a report can be rebuilt at any time::

    python -m hf_grpo.evaluation.report outputs/tiny
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

from ..outputs import EVAL_FILE, PLOT_FILE, SUMMARY_FILE
from .history import read_history
from .stats import METHOD, gain_from_run


logger = logging.getLogger(__name__)


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def read_eval_results(output_dir: str | Path) -> dict | None:
    path = Path(output_dir) / EVAL_FILE
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------------------------
# The paired before/after gain (hf_grpo.evaluation.stats)


def _usable_gain(gain, results: dict | None) -> dict | None:
    """``gain`` when it is a paired_gain dict that agrees with the before/after summaries of ``results``, else None.

    A gain computed from jsonl files of another evaluation (other problems, other grades) would put numbers next to
    the table that do not belong to it; leaving them out is better than showing them.
    """
    if not isinstance(gain, dict):
        return None
    try:
        n, low, high = int(gain["n"]), float(gain["ci95"][0]), float(gain["ci95"][1])
        values = [float(gain[k]) for k in ("gain", "before_accuracy", "after_accuracy")]
        int(gain["right_to_wrong"]), int(gain["wrong_to_right"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if n <= 0 or not all(math.isfinite(v) for v in (low, high, *values)):
        return None
    for phase in ("before", "after"):
        summary = (results or {}).get(phase)
        if not isinstance(summary, dict):
            continue
        if summary.get("total") is not None and summary["total"] != n:
            return None
        if summary.get("accuracy") is not None and abs(summary["accuracy"] - gain[f"{phase}_accuracy"]) > 1e-9:
            return None
    return gain


def read_gain(output_dir: str | Path, results: dict | None = None) -> dict | None:
    """The paired before/after gain of the run in ``output_dir`` (``hf_grpo.evaluation.stats.paired_gain``'s dict).

    ``eval_results.json["gain"]`` when the run stored it, else computed from ``eval_before.jsonl`` and
    ``eval_after.jsonl``; None (and the report leaves the numbers out) when neither is there, when the files cannot
    be paired, or when they disagree with the before/after summaries. ``results`` is ``eval_results.json`` when the
    caller has already read it.
    """
    if results is None:
        results = read_eval_results(output_dir)
    stored = (results or {}).get("gain")
    if stored is not None:
        if _usable_gain(stored, results) is not None:
            return stored
        logger.warning("%s: the stored gain does not match the before/after results; recomputing it", EVAL_FILE)
    try:
        gain = gain_from_run(output_dir)
    except (OSError, ValueError) as exc:
        logger.warning("no paired before/after interval in the report: %s", exc)
        return None
    if gain is not None and _usable_gain(gain, results) is None:
        logger.warning(
            "no paired before/after interval in the report: eval_before.jsonl / eval_after.jsonl in %s do not match "
            "%s (another evaluation?)",
            output_dir,
            EVAL_FILE,
        )
        return None
    return gain


def _points(x: float) -> str:
    return f"{x * 100:+.1f}"


def gain_interval(gain: dict) -> str:
    """``+3.5 points (95% CI -2.7 to +9.7)``: the paired difference in accuracy points with its interval."""
    low, high = gain["ci95"]
    return f"{_points(gain['gain'])} points (95% CI {_points(low)} to {_points(high)})"


def gain_sentence(gain: dict) -> str:
    """One plain sentence: does the 95% interval of the paired difference exclude zero, and how problems moved."""
    low, high = gain["ci95"]
    n = gain["n"]
    if low > 0:
        verdict = (
            f"The 95% interval of the difference excludes zero: on these {n} problems the gain is unlikely to be noise"
        )
    elif high < 0:
        verdict = (
            f"The 95% interval of the difference excludes zero: on these {n} problems the drop is unlikely to be noise"
        )
    else:
        verdict = (
            f"The 95% interval of the difference includes zero: on these {n} problems the change cannot be told "
            "apart from noise"
        )
    moved = f"{gain['wrong_to_right']} went wrong → right, {gain['right_to_wrong']} right → wrong"
    return f"{verdict} ({moved}; interval: {gain.get('method') or METHOD})."


# ---------------------------------------------------------------------------------------------------------------------
# Plot


def plot_training(
    history: list[dict], path: str | Path, eval_results: dict | None = None, gain: dict | None = None
) -> Path:
    """Write the four-panel PNG; returns its path."""
    path = Path(path)
    training_figure(history, eval_results, gain).savefig(path, dpi=100)
    return path


def _draw_gain(ax, gain: dict, before: float, step: int) -> None:
    """On the accuracy panel: the before level (dotted), and at the last step the interval of before + difference.

    The bar spans before + ci95, so it crosses the dotted line exactly when the interval includes zero.
    """
    low, high = gain["ci95"]
    after = before + gain["gain"]
    ax.axhline(before, color="tab:red", linestyle=":", linewidth=1, alpha=0.7)
    ax.errorbar(
        [step],
        [after],
        yerr=[[max(0.0, after - (before + low))], [max(0.0, before + high - after)]],
        fmt="none",
        ecolor="black",
        elinewidth=1.5,
        capsize=5,
        label="95% CI of after - before, from before (dotted)",
    )
    ax.text(
        0.02,
        0.98,
        f"held-out after - before: {_points(gain['gain'])} pts\n"
        f"95% CI {_points(low)} to {_points(high)} (paired, n={gain['n']})\n"
        f"{gain['right_to_wrong']} right→wrong, {gain['wrong_to_right']} wrong→right",
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=8,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"},
    )


def training_figure(history: list[dict], eval_results: dict | None = None, gain: dict | None = None):
    """The four-panel matplotlib figure (reward, train vs held-out accuracy, loss, reward range).

    With ``eval_results`` the held-out curve starts at the before and ends at the after accuracy; with a paired
    ``gain`` (``hf_grpo.evaluation.stats.paired_gain``; by default ``eval_results["gain"]`` when it holds one) the
    accuracy panel also shows the before -> after difference with its 95% interval, as an error bar at the last step
    and as text. Built without pyplot, so it neither needs a display nor changes the backend of the caller (a
    notebook keeps its inline plots).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7.5))
    axes = fig.subplots(2, 2)
    (ax_reward, ax_acc), (ax_loss, ax_band) = axes

    steps, reward = _series(history, "reward")
    ax_reward.plot(steps, reward, marker=".", color="tab:blue")
    ax_reward.set_title("Average reward per step")

    steps_acc, acc = _series(history, "accuracy")
    ax_acc.plot(steps_acc, acc, marker=".", color="tab:green", label="train (sampled)")
    eval_steps, eval_acc = _series(history, "eval/accuracy")
    if eval_results:
        last_step = history[-1]["step"] if history else 0
        eval_steps = [0, *eval_steps, last_step]
        eval_acc = [eval_results["before"]["accuracy"], *eval_acc, eval_results["after"]["accuracy"]]
    if eval_steps:
        ax_acc.plot(eval_steps, eval_acc, marker="o", color="tab:red", label="held-out (greedy)")
    if eval_results:
        gain = _usable_gain(gain if gain is not None else eval_results.get("gain"), eval_results)
        if gain is not None:
            _draw_gain(ax_acc, gain, eval_results["before"]["accuracy"], eval_steps[-1])
    ax_acc.set_title("Accuracy: train vs held-out")
    ax_acc.set_ylim(-0.02, 1.02)
    ax_acc.legend(loc="lower right")

    steps_loss, loss = _series(history, "loss")
    ax_loss.plot(steps_loss, loss, marker=".", color="tab:purple")
    ax_loss.set_title("Policy loss")

    band = [
        (r["step"], r["reward/min"], r["reward/max"], r["reward"])
        for r in history
        if all(r.get(k) is not None for k in ("reward/min", "reward/max", "reward"))
    ]
    if band:
        s, lo, hi, mean = zip(*band, strict=True)
        ax_band.fill_between(s, lo, hi, alpha=0.3, color="tab:blue", label="min-max")
        ax_band.plot(s, mean, color="tab:green", label="mean")
        ax_band.legend(loc="lower right")
    ax_band.set_title("Reward range per step")

    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def eval_table(results: dict, gain: dict | None = None) -> str:
    """The before/after table in Markdown (seed 002's layout: correct, formatted-but-wrong, unparseable).

    Problems whose grading timed out or failed (``timeout`` / ``error``, ``hf_grpo.evaluation.core``) get a row each
    when there are any, before or after.

    With a paired ``gain`` (by default ``results["gain"]`` when it holds one) two rows follow: the difference with its
    95% interval, and the right -> wrong / wrong -> right counts. Without one the table ends at the problem count.
    """
    gain = _usable_gain(gain if gain is not None else results.get("gain"), results)
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


def _num(value) -> str:
    """A logged number to 3 decimals; ``n/a`` for one that is missing or not finite (a batch no reward could score)."""
    return f"{value:.3f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def summary_markdown(output_dir: str | Path) -> str:
    """A Markdown summary of the run: held-out before/after table, training facts, the plot."""
    output_dir = Path(output_dir)
    history, results = read_history(output_dir), read_eval_results(output_dir)
    lines = [f"# Training summary: {output_dir.name}", ""]
    if results:
        gain = read_gain(output_dir, results)
        lines += ["## Held-out accuracy (greedy)", "", eval_table(results, gain), ""]
        if gain is not None:
            lines += [gain_sentence(gain), ""]
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
    if (output_dir / PLOT_FILE).is_file():
        lines += [f"![training curves]({PLOT_FILE})", ""]
    return "\n".join(lines)


def write_report(output_dir: str | Path) -> Path:
    """Plot the run in ``output_dir`` from its history and eval results, and write its Markdown summary."""
    output_dir = Path(output_dir)
    results = read_eval_results(output_dir)
    gain = read_gain(output_dir, results) if results else None
    plot = plot_training(read_history(output_dir), output_dir / PLOT_FILE, results, gain)
    (output_dir / SUMMARY_FILE).write_text(summary_markdown(output_dir))
    return plot


if __name__ == "__main__":
    print(write_report(sys.argv[1] if len(sys.argv) > 1 else "."))  # noqa: T201
