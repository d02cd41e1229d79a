"""The training figure: which panels ``choose_panels`` picks from a history, and that the PNG is drawn from them.

The synthetic histories use the keys a real run writes to ``training_history.json`` (TRL 1.16's GRPOTrainer logs
plus hf_grpo's ``accuracy``, ``reward/min`` / ``reward/max`` and the periodic ``eval/accuracy``).
"""

from __future__ import annotations

import pytest

from hf_grpo.publish.plot import choose_panels, plot_training, training_figure


def record(step: int, *, beta: float = 0.0, rewards: dict[str, float] | None = None, periodic: int = 0) -> dict:
    """One logged step as HistoryCallback writes it; ``rewards`` maps reward function -> mean (one 0/1 by default)."""
    accuracy = 0.1 + 0.05 * step
    rewards = rewards or {"gsm8k_correctness": accuracy}
    row = {
        "step": step,
        "epoch": 0.004 * step,
        "loss": -0.1 / step,
        "grad_norm": 0.2,
        "learning_rate": 0.002,
        "num_tokens": 17000.0 * step,
        "completions/mean_length": 10.0 + step % 3,
        "completions/min_length": 1.0 + 0.1 * step,
        "completions/max_length": 16.0,
        "completions/clipped_ratio": 0.2 + 0.01 * step,
        "completions/mean_terminated_length": 8.5,
        "completions/min_terminated_length": 1.2,
        "completions/max_terminated_length": 15.5,
    }
    for name, mean in rewards.items():
        row |= {f"rewards/{name}/nonfinite": 0.0, f"rewards/{name}/mean": mean, f"rewards/{name}/std": 0.2}
    row |= {
        "reward": sum(rewards.values()),
        "reward_std": 0.2,
        "frac_reward_zero_std": 0.9,
        "accuracy": accuracy,
        "grade/unparseable": 0.06,
        "grade/wrong": 0.9 - accuracy,
        "reward/min": 0.0,
        "reward/max": 1.0,
        "advantage/mean": 0.0,
        "advantage/std": 0.7,
    }
    if beta:
        row["kl"] = 0.01 * (step - 1)
    row |= {"entropy": 2.35 + 0.01 * (step % 2), "clip_ratio/region_mean": 0.0, "step_time": 1.8}
    if periodic and step % periodic == 0:
        row["eval/accuracy"] = 0.2 + 0.02 * step
    return row


def history(steps: int = 6, **kwargs) -> list[dict]:
    """``steps`` logged steps, then the end-of-training record that carries no metric."""
    end = {"step": steps, "epoch": 0.004 * steps, "train_runtime": 7.5, "total_flos": 0.0, "train_loss": -0.07}
    return [record(s, **kwargs) for s in range(1, steps + 1)] + [end]


EVAL = {
    "before": {"accuracy": 0.2, "correct": 40, "wrong": 160, "unparseable": 0, "total": 200},
    "after": {"accuracy": 0.32, "correct": 64, "wrong": 136, "unparseable": 0, "total": 200},
}
GAIN = {
    "n": 200,
    "before_accuracy": 0.2,
    "after_accuracy": 0.32,
    "gain": 0.12,
    "ci95": [0.06, 0.18],
    "right_to_wrong": 4,
    "wrong_to_right": 28,
}


def by_key(panels) -> dict:
    return {p.key: p for p in panels}


def labels(panel) -> list[str]:
    return [s.label for s in panel.series]


def assert_informative(panels) -> None:
    """No band that is fixed by construction, no series repeating another one, no empty series."""
    seen = []
    for panel in panels:
        for s in panel.series:
            assert s.steps and len(s.steps) == len(s.values), (panel.key, s.label)
            if s.kind == "band":
                assert len(set(s.values)) > 1 or len(set(s.upper)) > 1, (panel.key, s.label)
            assert (s.steps, s.values) not in seen, (panel.key, s.label)
            seen.append((s.steps, s.values))


def test_default_run_beta_zero_one_correctness_reward():
    panels = choose_panels(history(periodic=2), EVAL)
    assert [p.key for p in panels] == ["accuracy", "length", "entropy"]
    assert_informative(panels)
    accuracy = panels[0]
    assert accuracy.title == "Accuracy: train vs held-out"
    train, heldout = accuracy.series
    assert train.label == "train, sampled (= reward)"  # the reward panel would only repeat it: left out
    # before at step 0, every periodic evaluation, after at the last step
    # (the periodic evaluation of step 6 measured the after model: drawn once)
    assert heldout.steps == (0, 2, 4, 6) and heldout.values == pytest.approx((0.2, 0.24, 0.28, 0.32))
    assert heldout.label == "held-out, greedy (n=200)"
    assert panels[2].title == "Policy entropy; KL not computed (beta = 0)"
    assert all(s.label != "KL(policy || reference)" for p in panels for s in p.series)
    length = panels[1]
    assert labels(length) == ["shortest to longest", "mean", "clipped at max length"]
    assert [s.right_axis for s in length.series] == [False, False, True] and length.right_ylabel == "fraction clipped"


def test_periodic_evaluation_of_the_last_step_on_fewer_problems_is_kept():
    rows = history(periodic=3)  # eval/accuracy at steps 3 and 6, step 6 agreeing with the after evaluation
    heldout = choose_panels(rows, EVAL)[0].series[-1]
    assert heldout.steps == (0, 3, 6) and heldout.values == pytest.approx((0.2, 0.26, 0.32))
    rows[5]["eval/accuracy"] = 0.3  # task_eval_max_samples: a subset, another measurement than the after one
    heldout = choose_panels(rows, EVAL)[0].series[-1]
    assert heldout.steps == (0, 3, 6, 6) and heldout.values == pytest.approx((0.2, 0.26, 0.3, 0.32))


def test_kl_gets_its_own_panel_when_beta_is_not_zero():
    panels = by_key(choose_panels(history(beta=0.04), EVAL))
    assert list(panels) == ["accuracy", "length", "kl", "entropy"]
    assert panels["kl"].series[0].values == pytest.approx(tuple(0.01 * s for s in range(6)))
    assert panels["entropy"].title == "Policy entropy"
    assert_informative(panels.values())


def test_several_rewards_that_differ_get_a_reward_panel_with_a_line_each():
    rows = [
        record(s, rewards={"correctness": 0.1 * s, "format": 0.5 - 0.05 * s}) | {"reward/min": 0.05 * s}
        for s in range(1, 6)
    ]
    panels = by_key(choose_panels(rows))
    assert list(panels) == ["accuracy", "reward", "length", "entropy"]
    assert labels(panels["reward"]) == ["mean reward", "lowest to highest in the batch", "correctness", "format"]
    assert panels["accuracy"].title == "Train accuracy (sampled)"
    assert labels(panels["accuracy"]) == ["train, sampled"]
    assert_informative(panels.values())


def test_reward_lines_repeating_another_series_are_left_out():
    # two reward functions, the second always 0: the mean reward is the first function, which is the accuracy
    rows = [record(s, rewards={"correctness": 0.1 + 0.05 * s, "format": 0.0}) for s in range(1, 6)]
    reward = by_key(choose_panels(rows))["reward"]
    assert labels(reward) == ["format"]  # mean reward and correctness: on the accuracy panel
    # the same with a constant 0..1 batch range: no band (0..1 is fixed by a 0/1 reward), no panel at all
    rows = [record(s) for s in range(1, 6)]
    assert "reward" not in by_key(choose_panels(rows))


def test_constant_edges_give_no_band():
    rows = history()
    for row in rows:
        if "completions/min_length" in row:
            row["completions/min_length"] = 1.0
    length = by_key(choose_panels(rows))["length"]
    assert labels(length) == ["mean", "clipped at max length"]


def test_without_periodic_evaluation_the_heldout_curve_is_before_and_after():
    heldout = choose_panels(history(), EVAL)[0].series[-1]
    assert heldout.steps == (0, 6) and heldout.values == (0.2, 0.32)
    # no held-out evaluation at all: only what training logged
    panels = choose_panels(history(), None)
    assert panels[0].title == "Train accuracy (sampled)"
    assert not any(s.kind == "points" for p in panels for s in p.series)


def test_an_earlier_kept_adapter_is_named_where_the_after_point_is_drawn():
    """The run watch kept step 2's adapter: the after evaluation (drawn at the last step) is that adapter's."""
    kept = {**EVAL, "kept": {"step": 2, "accuracy": 0.3, "n": 50, "last_step": 6}}
    heldout = choose_panels(history(), kept)[0].series[-1]
    assert heldout.steps == (0, 6)
    assert heldout.label == "held-out, greedy (n=200); after: step 2's adapter, kept"
    kept["kept"]["step"] = 6  # the last state kept: nothing to say
    assert choose_panels(history(), kept)[0].series[-1].label == "held-out, greedy (n=200)"


def test_missing_data_leaves_panels_out():
    assert choose_panels([]) == []
    bare = [{"step": s, "loss": 0.1, "reward": 0.1 * s} for s in range(1, 4)]
    assert [p.key for p in choose_panels(bare)] == ["reward"]
    assert [p.key for p in choose_panels([], EVAL)] == ["accuracy"]


def test_png_has_one_axis_per_panel_plus_the_clipped_axis(tmp_path):
    rows = history(beta=0.04, periodic=2)
    path = plot_training(rows, tmp_path / "curves.png", {**EVAL, "gain": GAIN})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000

    panels = choose_panels(rows, EVAL)
    figure = training_figure(rows, {**EVAL, "gain": GAIN})
    main = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in main] == [p.title for p in panels]
    assert len(figure.axes) == len(panels) + 1  # the clipped fraction's second y axis
    for ax in main:
        drawn = [line for line in ax.get_lines() if len(line.get_xdata()) > 1] + list(ax.collections)
        assert drawn, f"panel {ax.get_title()!r} is empty"
    assert {ax.get_xlabel() for ax in main[-2:]} == {"optimizer step"}
    accuracy = main[0]
    assert "+12.0 pts" in accuracy.texts[0].get_text() and accuracy.containers  # the gain and its error bar
    assert accuracy.get_xlim() == main[-1].get_xlim()  # one shared step axis

    odd = training_figure(history(), EVAL)  # three panels: the accuracy panel spans the top row
    assert odd.axes[0].get_position().width > 2 * odd.axes[1].get_position().width
    assert training_figure([]).axes == []  # nothing logged: a figure with a line of text, no empty panels


def crossing_history(spread: float) -> tuple[list[dict], dict]:
    """40 steps whose train accuracy zigzags over ``spread`` and a held-out curve rising from 0.4 to 0.7: lines all
    over the accuracy panel, so no corner of it is free (a legend at "best" lands on whatever else is there)."""
    rows = history(steps=40, beta=0.04, periodic=5)  # with KL: four panels, the accuracy panel half as wide
    for row in rows[:-1]:
        row["accuracy"] = row["reward"] = row["rewards/gsm8k_correctness/mean"] = (
            0.05 + spread * (row["step"] * 7 % 10) / 10
        )
        if "eval/accuracy" in row:
            row["eval/accuracy"] = 0.4 + 0.3 * row["step"] / 40
    results = {"before": {"accuracy": 0.4, "total": 200}, "after": {"accuracy": 0.7, "total": 200}}
    gain = {**GAIN, "before_accuracy": 0.4, "after_accuracy": 0.7, "gain": 0.3, "ci95": [0.2, 0.4]}
    return rows, {**results, "gain": gain}


@pytest.mark.parametrize("spread", [0.05, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("odd", [False, True])
def test_the_legend_covers_neither_the_gain_nor_the_title(spread, odd):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows, results = crossing_history(spread)
    if odd:  # without KL: three panels, the accuracy panel spans the top row
        rows = [{k: v for k, v in row.items() if k != "kl"} for row in rows]
    figure = training_figure(rows, results)
    FigureCanvasAgg(figure).draw()
    renderer = figure.canvas.get_renderer()
    accuracy = figure.axes[0]
    (gain,) = [t for t in accuracy.texts if "pts" in t.get_text()]
    boxes = {
        "legend": accuracy.get_legend().get_window_extent(renderer),
        "gain": gain.get_window_extent(renderer),
        "title": accuracy.title.get_window_extent(renderer),
    }
    for a, b in [("legend", "gain"), ("legend", "title"), ("gain", "title")]:
        assert not boxes[a].overlaps(boxes[b]), f"the {a} covers the {b}: {boxes[a]} and {boxes[b]}"
    page = figure.bbox
    assert page.x0 <= boxes["gain"].x0 and boxes["gain"].x1 <= page.x1 and boxes["title"].y1 <= page.y1
