"""The training figure (``training_curves.png``): did it learn?

Held-out accuracy before, during (periodic ``eval/accuracy``) and after training with the paired before -> after
difference and its 95% interval, next to the sampled train accuracy; then the training reward, completion length, KL
and entropy. ``choose_panels`` picks the panels from the history alone (absent data, or a series that repeats
another, gets no panel or line), so the figure adapts to the run; ``training_figure`` draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..evaluation.stats import points, usable_gain


@dataclass(frozen=True)
class Series:
    """One thing drawn on a panel: a line of ``values`` per step, or (``upper`` set) a band from values to upper.

    ``kind`` is ``line`` (per-step training metric), ``points`` (evaluations: before, periodic, after) or ``band``;
    ``right_axis`` puts it against a second y axis (another unit than the panel's own).
    """

    label: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    kind: str = "line"
    upper: tuple[float, ...] | None = None
    right_axis: bool = False


@dataclass(frozen=True)
class Panel:
    """One subplot: ``key`` (accuracy, reward, length, kl, entropy), its title, y-axis labels and series."""

    key: str
    title: str
    ylabel: str
    series: tuple[Series, ...]
    right_ylabel: str | None = None


def _rows(history: list[dict], *keys: str) -> list[tuple]:
    """(step, value of each key) of the records where every one of ``keys`` was logged with a finite value."""
    return [
        (r["step"], *(float(r[k]) for k in keys))
        for r in history
        if "step" in r and all(isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) for k in keys)
    ]


def _line(history: list[dict], key: str, label: str, **kwargs) -> Series | None:
    rows = _rows(history, key)
    return Series(label, *zip(*rows, strict=True), **kwargs) if rows else None


def _same(a: Series | None, b: Series | None) -> bool:
    """Both logged at the same steps with the same values: one of them would only repeat the other."""
    if a is None or b is None or a.steps != b.steps:
        return False
    return all(abs(x - y) <= 1e-9 for x, y in zip(a.values, b.values, strict=True))


def _constant(values) -> bool:
    return max(values) - min(values) <= 1e-12


def _band(history: list[dict], low_key: str, high_key: str, label: str) -> Series | None:
    """A min-max band where both edges are logged, left out when neither edge ever moves (it would say nothing)."""
    rows = _rows(history, low_key, high_key)
    if not rows:
        return None
    steps, low, high = zip(*rows, strict=True)
    if _constant(low) and _constant(high):
        return None
    return Series(label, steps, low, kind="band", upper=high)


def _heldout(history: list[dict], eval_results: dict | None) -> Series | None:
    """Greedy held-out accuracy: before and after a warm start (both at step 0), every periodic ``eval/accuracy``,
    after (the last step)."""
    points = _rows(history, "eval/accuracy")
    before, warm, after = ((eval_results or {}).get(phase) for phase in ("before", "warm_start", "after"))
    for start in (warm, before):
        if isinstance(start, dict) and start.get("accuracy") is not None:
            points.insert(0, (0, start["accuracy"]))
    if isinstance(after, dict) and after.get("accuracy") is not None:
        last = max((r["step"] for r in history if "step" in r), default=0)
        if points and points[-1][0] == last and abs(points[-1][1] - after["accuracy"]) <= 1e-12:
            points.pop()  # the periodic evaluation of the last step is the after evaluation
        points.append((last, after["accuracy"]))
    if not points:
        return None
    total = next((p.get("total") for p in (before, after) if isinstance(p, dict) and p.get("total")), None)
    label = f"held-out, greedy (n={total})" if total else "held-out, greedy"
    kept = (eval_results or {}).get("kept")
    if isinstance(kept, dict) and kept.get("step") != kept.get("last_step"):
        label += f"; after: step {kept['step']}'s adapter, kept"  # hf_grpo.monitoring.run_watch kept an earlier one
    steps, values = zip(*points, strict=True)
    return Series(label, steps, values, kind="points")


def _reward_functions(history: list[dict]) -> list[str]:
    """Names of the reward functions TRL logged a per-function mean for (``rewards/<name>/mean``)."""
    names = (
        k[len("rewards/") : -len("/mean")]
        for r in history
        for k in r
        if k.startswith("rewards/") and k.endswith("/mean")
    )
    return list(dict.fromkeys(names))


def _accuracy_panel(history: list[dict], eval_results: dict | None, reward: Series | None) -> Panel | None:
    heldout = _heldout(history, eval_results)
    train = _line(history, "accuracy", "train, sampled")
    if train is not None and _same(train, reward):
        train = replace(train, label="train, sampled (= reward)")
    series = tuple(s for s in (train, heldout) if s is not None)
    if not series:
        return None
    if train is not None and heldout is not None:
        title = "Accuracy: train vs held-out"
    else:
        title = "Held-out accuracy" if heldout is not None else "Train accuracy (sampled)"
    return Panel("accuracy", title, "fraction correct", series)


def _reward_panel(history: list[dict], reward: Series | None, accuracy: Series | None) -> Panel | None:
    """Mean reward, its batch min-max and one line per reward function, leaving out what another series repeats.

    With a single 0/1 correctness reward the mean reward is the train accuracy (drawn on the accuracy panel) and the
    batch min-max is 0..1 by construction, so the panel is left out.
    """
    if reward is None:
        return None
    kept: list[Series] = []
    if not _same(reward, accuracy):  # else a single 0/1 correctness reward: the accuracy panel draws it
        band = _band(history, "reward/min", "reward/max", "lowest to highest in the batch")
        kept = [reward] + ([band] if band is not None else [])
    names = _reward_functions(history)
    if len(names) > 1:
        for name in names:
            line = _line(history, f"rewards/{name}/mean", name)
            if line is not None and not any(_same(line, s) for s in (reward, accuracy, *kept)):
                kept.append(line)
    if not kept:
        return None
    return Panel("reward", "Training reward (sampled completions)", "reward", tuple(kept))


def _length_panel(history: list[dict]) -> Panel | None:
    mean = _line(history, "completions/mean_length", "mean")
    if mean is None:
        return None
    band = _band(history, "completions/min_length", "completions/max_length", "shortest to longest")
    clipped = _line(history, "completions/clipped_ratio", "clipped at max length", right_axis=True)
    series = tuple(s for s in (band, mean, clipped) if s is not None)
    right = "fraction clipped" if clipped is not None else None
    return Panel("length", "Completion length", "tokens", series, right)


def choose_panels(history: list[dict], eval_results: dict | None = None) -> list[Panel]:
    """The panels of the training figure, in order, from ``training_history.json``'s records and eval results.

    1. accuracy: greedy held-out accuracy at step 0 (before), at every periodic ``eval/accuracy`` and at the last
       step (after); the sampled train accuracy with it. 2. reward: the mean reward, its batch min-max and the
       per-function means, only what does not repeat another series (a single 0/1 correctness reward *is* the train
       accuracy, and its min-max is 0..1 by construction). 3. length: completion length (mean, min-max) and the
       fraction clipped at ``max_completion_length``. 4. kl: TRL logs ``kl`` only when beta != 0. 5. entropy, whose
       title says when the KL was not computed. A panel without data is left out.
    """
    reward = _line(history, "reward", "mean reward")
    accuracy = _line(history, "accuracy", "train, sampled")
    panels = [
        _accuracy_panel(history, eval_results, reward),
        _reward_panel(history, reward, accuracy),
        _length_panel(history),
    ]
    kl = _line(history, "kl", "KL(policy || reference)")
    if kl is not None:
        panels.append(Panel("kl", "KL to the reference model", "nats per token", (kl,)))
    entropy = _line(history, "entropy", "entropy")
    if entropy is not None:
        title = "Policy entropy" if kl is not None else "Policy entropy; KL not computed (beta = 0)"
        panels.append(Panel("entropy", title, "nats per token", (entropy,)))
    return [p for p in panels if p is not None]


def plot_training(
    history: list[dict], path: str | Path, eval_results: dict | None = None, gain: dict | None = None
) -> Path:
    """Write the training figure (``choose_panels``) as a PNG; returns its path."""
    path = Path(path)
    training_figure(history, eval_results, gain).savefig(path, dpi=100)
    return path


GAIN_FONT = 8  # points: the gain's text above the accuracy panel
GAIN_GAP = 4  # points between the axes, the gain's text and the title


def _draw_gain(ax, gain: dict, before: float, step: int, grpo: dict | None = None) -> None:
    """On the accuracy panel: the before level (dotted), and at the last step the interval of before + difference.

    The bar spans before + ci95, so it crosses the dotted line exactly when the interval includes zero. The numbers
    go above the axes, under the title (which moves up to make room): inside, the legend or the data would cover them.
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
    lines = [
        f"held-out after - before: {points(gain['gain'])} pts",
        f"95% CI {points(low)} to {points(high)} (paired, n={gain['n']})",
        f"{gain['right_to_wrong']} right→wrong, {gain['wrong_to_right']} wrong→right",
    ]
    if grpo is not None:  # a warm start came first: what GRPO itself added
        lines.append(f"GRPO's own, after - warm start: {points(grpo['gain'])} pts, 95% CI {points(grpo['ci95'][0])} "
                     f"to {points(grpo['ci95'][1])}")  # fmt: skip
    ax.annotate(
        "\n".join(lines),
        xy=(0, 1),
        xycoords="axes fraction",
        xytext=(0, GAIN_GAP),
        textcoords="offset points",
        va="bottom",
        ha="left",
        fontsize=GAIN_FONT,
    )
    # the title above the text: its lines (matplotlib spaces them 1.2 font sizes apart) and a gap on each side
    ax.set_title(ax.get_title(), pad=GAIN_GAP + len(lines) * 1.25 * GAIN_FONT + GAIN_GAP)


_COLORS = {"points": "tab:red", "band": "tab:blue"}
_LINE_COLORS = ("tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:olive")


def _draw_series(ax, series: Series, color: str, linestyle: str = "-") -> None:
    if series.kind == "band":
        ax.fill_between(series.steps, series.values, series.upper, alpha=0.2, color=color, label=series.label)
    else:
        marker = "o" if series.kind == "points" else "."
        ax.plot(series.steps, series.values, marker=marker, color=color, linestyle=linestyle, label=series.label)


def _draw_panel(ax, panel: Panel) -> None:
    right = ax.twinx() if panel.right_ylabel else None
    colors = iter(_LINE_COLORS)
    for series in panel.series:
        if series.right_axis:
            _draw_series(right, series, "tab:gray", linestyle="--")
        else:
            _draw_series(ax, series, _COLORS.get(series.kind) or next(colors))
    ax.set_title(panel.title)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if panel.key == "accuracy":
        ax.set_ylim(-0.02, 1.02)
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        right.set_ylabel(panel.right_ylabel)
        right.set_ylim(-0.02, 1.02)
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if len(handles) > 1 or panel.key in ("accuracy", "reward"):
        ax.legend(handles, labels, loc="best", fontsize=8)


def _panel_axes(fig, count: int) -> list:
    """``count`` axes on a two-column grid sharing the step axis; with an odd count the first spans the top row."""
    if count == 1:
        return [fig.add_subplot(1, 1, 1)]
    rows = (count + 1) // 2
    grid = fig.add_gridspec(rows, 2)
    cells = [grid[0, :]] if count % 2 else []
    cells += [grid[r, c] for r in range(rows) for c in range(2)][2 * len(cells) :]
    axes = [fig.add_subplot(cell) for cell in cells[:count]]
    for ax in axes[1:]:
        ax.sharex(axes[0])
    return axes


def training_figure(history: list[dict], eval_results: dict | None = None, gain: dict | None = None):
    """The training figure: one panel per ``choose_panels`` entry, against the optimizer step.

    With ``eval_results`` the held-out curve starts at the before and ends at the after accuracy; with a paired
    ``gain`` (``hf_grpo.evaluation.stats.paired_gain``; by default ``eval_results["gain"]`` when it holds one) the
    accuracy panel also shows the before -> after difference with its 95% interval, as an error bar at the last step
    and as text. The run watch's findings are red dotted lines at their steps. Built without pyplot, so it neither needs a display nor changes the backend of the caller (a
    notebook keeps its inline plots).
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = choose_panels(history, eval_results)
    rows = max(1, (len(panels) + 1) // 2)
    fig = Figure(figsize=(11, 1.0 + 3.2 * rows))
    if not panels:
        fig.text(0.5, 0.5, "nothing logged yet", ha="center", va="center")
        return fig
    findings = [
        r["watch"] for r in history if isinstance(r.get("watch"), dict)
    ]  # the run watch's (hf_grpo.monitoring.run_watch)
    for ax, panel in zip(_panel_axes(fig, len(panels)), panels, strict=True):
        _draw_panel(ax, panel)
        for i, finding in enumerate(findings):  # a mark at the step each was seen, named on the first panel
            ax.axvline(finding["step"], color="tab:red", alpha=0.5, linestyle=":")
            if panel is panels[0]:
                ax.annotate(finding["kind"], (finding["step"], 1.0), xycoords=("data", "axes fraction"),
                            xytext=(2, -10 - 10 * i), textcoords="offset points", color="tab:red", fontsize=8)  # fmt: skip
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_subplotspec().is_last_row():
            ax.set_xlabel("optimizer step")
        if panel.key == "accuracy" and eval_results and any(s.kind == "points" for s in panel.series):
            usable = usable_gain(gain if gain is not None else eval_results.get("gain"), eval_results)
            before = (eval_results.get("before") or {}).get("accuracy")
            if usable is not None and before is not None:
                grpo = (eval_results.get("gains") or {}).get("grpo")
                _draw_gain(ax, usable, before, panel.series[-1].steps[-1], grpo)
                ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig
