"""Training report: seed 002's four-panel plot and a Markdown summary with the before/after table.

Panels: (1) mean reward per step, (2) train accuracy vs held-out accuracy, (3) loss, (4) the reward's min/max band
with its mean. ``summary.md`` holds the before/after table (correct, answered-but-wrong, no answer found) and the
training facts. Everything is read from ``training_history.json`` and ``eval_results.json``, so a report can be
rebuilt at any time::

    python -m hf_grpo.evaluation.report outputs/tiny
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..outputs import EVAL_FILE, PLOT_FILE, SUMMARY_FILE
from .history import read_history


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def read_eval_results(output_dir: str | Path) -> dict | None:
    path = Path(output_dir) / EVAL_FILE
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def plot_training(history: list[dict], path: str | Path, eval_results: dict | None = None) -> Path:
    """Write the four-panel PNG; returns its path."""
    path = Path(path)
    training_figure(history, eval_results).savefig(path, dpi=100)
    return path


def training_figure(history: list[dict], eval_results: dict | None = None):
    """The four-panel matplotlib figure (reward, train vs held-out accuracy, loss, reward range).

    Built without pyplot, so it neither needs a display nor changes the backend of the caller (a notebook keeps its
    inline plots).
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


def eval_table(results: dict) -> str:
    """The before/after table in Markdown (seed 002's layout: correct, formatted-but-wrong, unparseable)."""
    rows = ["| metric | before | after | change |", "|---|---|---|---|"]
    before, after = results["before"], results["after"]
    b_total, a_total = before["total"] or 1, after["total"] or 1
    rows.append(
        f"| accuracy | {before['accuracy']:.1%} | {after['accuracy']:.1%} | "
        f"{(after['accuracy'] - before['accuracy']) * 100:+.1f} points |"
    )
    for key, label in (("correct", "correct"), ("wrong", "answered, wrong"), ("unparseable", "no answer found")):
        rows.append(
            f"| {label} | {before[key]} ({before[key] / b_total:.1%}) | {after[key]} ({after[key] / a_total:.1%}) "
            f"| {after[key] - before[key]:+d} |"
        )
    rows.append(f"| held-out problems | {before['total']} | {after['total']} | |")
    return "\n".join(rows)


def summary_markdown(output_dir: str | Path) -> str:
    """A Markdown summary of the run: held-out before/after table, training facts, the plot."""
    output_dir = Path(output_dir)
    history, results = read_history(output_dir), read_eval_results(output_dir)
    lines = [f"# Training summary: {output_dir.name}", ""]
    if results:
        lines += ["## Held-out accuracy (greedy)", "", eval_table(results), ""]
    logged = [r for r in history if "reward" in r]
    if logged:
        last = logged[-1]
        runtime = next((r["train_runtime"] for r in reversed(history) if "train_runtime" in r), None)
        lines += ["## Training", "", f"- optimizer steps: {last['step']}"]
        if runtime is not None:
            lines.append(f"- training time: {runtime:.0f} s")
        lines.append(f"- reward: {logged[0]['reward']:.3f} (first log) -> {last['reward']:.3f} (last log)")
        if "accuracy" in last:
            lines.append(f"- train accuracy (sampled): {logged[0]['accuracy']:.3f} -> {last['accuracy']:.3f}")
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
    plot = plot_training(read_history(output_dir), output_dir / PLOT_FILE, read_eval_results(output_dir))
    (output_dir / SUMMARY_FILE).write_text(summary_markdown(output_dir))
    return plot


if __name__ == "__main__":
    print(write_report(sys.argv[1] if len(sys.argv) > 1 else "."))  # noqa: T201
