"""The paired before/after gain (hf_grpo.evaluation.stats) and where users read it: summary.md, the plot, the card.

Grade lists are built by hand from a 2x2 table (right->wrong, wrong->right, right both times, wrong both times), so
each expected count and interval is known; the report tests use a fake run directory (eval_results.json, the two
per-problem jsonl files, training_history.json) and never train.
"""

from __future__ import annotations

import doctest
import json
import logging
import math
import random

import pytest

from hf_grpo.evaluation import stats
from hf_grpo.evaluation.stats import gain_from_run, paired_gain
from hf_grpo.publish import report
from hf_grpo.publish.card import model_card
from hf_grpo.publish.plot import training_figure
from hf_grpo.publish.run_result import RunResult
from hf_grpo.publish.summary import summary_markdown


def table(n: int, right_to_wrong: int, wrong_to_right: int, both_right: int = 0) -> tuple[list[str], list[str]]:
    """(before, after) grades of n problems with these cell counts; the rest are wrong both times."""
    rest = n - right_to_wrong - wrong_to_right - both_right
    assert rest >= 0
    before = ["correct"] * right_to_wrong + ["wrong"] * wrong_to_right + ["correct"] * both_right + ["wrong"] * rest
    after = ["wrong"] * right_to_wrong + ["correct"] * wrong_to_right + ["correct"] * both_right + ["wrong"] * rest
    return before, after


# ---------------------------------------------------------------------------------------------------------------------
# paired_gain: known answers


@pytest.mark.parametrize("both_right", [0, 5, 10])
def test_no_change_gives_an_open_interval_around_zero(both_right):
    """All d_i = 0 on 10 problems (all wrong, half right, all right): gain 0, yet the interval is not a point."""
    before, after = table(10, 0, 0, both_right)
    g = paired_gain(before, after)
    assert g["n"] == 10 and g["gain"] == 0.0
    assert g["right_to_wrong"] == 0 and g["wrong_to_right"] == 0
    assert g["before_accuracy"] == g["after_accuracy"] == both_right / 10
    low, high = g["ci95"]
    # 1.96 * sqrt(2 / 12) / 12 = 0.2310: one pseudo-problem each way out of n + 2
    assert low == pytest.approx(-0.2310, abs=1e-4) and high == pytest.approx(0.2310, abs=1e-4)
    assert "Bonett-Price" in g["method"]


def test_all_improved_and_all_worse():
    """All d_i = +1 (or -1) on 10 problems: gain +-1, the interval is truncated at the bound and stays open inside."""
    up = paired_gain(*table(10, 0, 10))
    assert up["gain"] == 1.0 and up["wrong_to_right"] == 10 and up["right_to_wrong"] == 0
    assert up["before_accuracy"] == 0.0 and up["after_accuracy"] == 1.0
    assert up["ci95"][1] == 1.0 and up["ci95"][0] == pytest.approx(0.5205, abs=1e-4)
    down = paired_gain(*table(10, 10, 0))
    assert down["gain"] == -1.0 and down["right_to_wrong"] == 10
    assert down["ci95"][0] == -1.0 and down["ci95"][1] == pytest.approx(-0.5205, abs=1e-4)
    # one problem: still a proper interval, wide
    single = paired_gain(["wrong"], ["correct"])
    assert single["gain"] == 1.0 and single["ci95"][1] == 1.0 and single["ci95"][0] < 0


def test_the_issues_16_and_15_on_200_problems_is_noise():
    g = paired_gain(*table(200, 16, 15, both_right=70))
    assert (g["right_to_wrong"], g["wrong_to_right"]) == (16, 15)
    assert g["gain"] == pytest.approx(-0.005)
    low, high = g["ci95"]
    assert low < 0 < high
    assert low == pytest.approx(-0.0607, abs=1e-4) and high == pytest.approx(0.0508, abs=1e-4)
    # the same +3.5 points that the issue saw (16 right->wrong against 23 wrong->right) is noise too
    noisy = paired_gain(*table(200, 16, 23, both_right=64))
    assert noisy["gain"] == pytest.approx(0.035) and noisy["ci95"][0] < 0 < noisy["ci95"][1]


def test_a_clear_gain_excludes_zero():
    g = paired_gain(*table(200, 2, 30, both_right=60))
    assert g["gain"] == pytest.approx(0.14)
    assert 0 < g["ci95"][0] < 0.14 < g["ci95"][1]
    # and +3.5 points made of 1 right->wrong against 8 wrong->right is a real gain, unlike 16 against 23
    assert paired_gain(*table(200, 1, 8, both_right=64))["ci95"][0] > 0
    # a clear drop excludes zero from above
    assert paired_gain(*table(200, 30, 2, both_right=60))["ci95"][1] < 0


def test_published_example():
    """Cavo et al. (2012) as analysed by Fagerland, Lydersen & Laake (2014): 0.0032 to 0.1195 (difference 0.0621)."""
    g = paired_gain(*table(161, 6, 16, both_right=59))
    assert g["gain"] == pytest.approx(10 / 161)
    assert [round(x, 4) for x in g["ci95"]] == [0.0032, 0.1195]


def test_doctests():
    """The docstring's example pins the published interval."""
    result = doctest.testmod(stats)
    assert result.attempted >= 4 and result.failed == 0


def test_unparseable_counts_as_not_right_and_order_is_paired():
    g = paired_gain(["unparseable", "correct", "wrong", "unparseable"], ["wrong", "unparseable", "correct", "correct"])
    assert (g["right_to_wrong"], g["wrong_to_right"]) == (1, 2)
    assert g["before_accuracy"] == 0.25 and g["after_accuracy"] == 0.5 and g["gain"] == 0.25
    # same marginals, different pairing: the counts (and so the interval) follow the pairing, not the accuracies
    other = paired_gain(["correct", "wrong", "wrong", "wrong"], ["correct", "correct", "wrong", "wrong"])
    assert other["before_accuracy"] == 0.25 and other["after_accuracy"] == 0.5
    assert (other["right_to_wrong"], other["wrong_to_right"]) == (0, 1)
    assert other["ci95"] != g["ci95"]


def test_interval_always_contains_the_gain_and_is_open():
    for n in range(1, 31):
        for b in range(n + 1):
            for c in range(n - b + 1):
                g = paired_gain(*table(n, b, c))
                low, high = g["ci95"]
                assert -1.0 <= low <= g["gain"] <= high <= 1.0, (n, b, c)
                assert high - low > 0.05, (n, b, c)


def _coverage(n: int, p_rw: float, p_wr: float) -> float:
    """Exact probability that the interval covers p_wr - p_rw, summed over every 2x2 table of n problems."""
    covered = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            low, high = paired_gain(*table(n, b, c))["ci95"]
            if low <= p_wr - p_rw <= high:
                ways = math.factorial(n) // (math.factorial(b) * math.factorial(c) * math.factorial(n - b - c))
                covered += ways * p_rw**b * p_wr**c * (1 - p_rw - p_wr) ** (n - b - c)
    return covered


def test_coverage_is_close_to_95_percent_at_small_n():
    """The reason for the method: near-nominal coverage at 10-30 problems, including no right->wrong at all."""
    settings = [(n, p, q) for n in (10, 20, 30) for p in (0.0, 0.05, 0.2) for q in (0.02, 0.1, 0.3)]
    coverages = [_coverage(*s) for s in settings]
    assert min(coverages) > 0.92, min(zip(coverages, settings, strict=True))
    assert sum(coverages) / len(coverages) > 0.95


# ---------------------------------------------------------------------------------------------------------------------
# paired_gain: input validation


def test_rejects_unequal_lengths_and_empty_input():
    with pytest.raises(ValueError, match="before has 3 grades and after has 2"):
        paired_gain(["correct"] * 3, ["correct"] * 2)
    with pytest.raises(ValueError, match="at least one"):
        paired_gain([], [])


def test_rejects_what_is_not_a_list_of_grades():
    with pytest.raises(TypeError, match="single string"):
        paired_gain("correct", "correct")
    with pytest.raises(TypeError, match=r"after\[1\] is True"):
        paired_gain(["correct", "wrong"], ["correct", True])


# ---------------------------------------------------------------------------------------------------------------------
# gain_from_run


def write_records(path, grades, indices=None):
    indices = list(range(len(grades))) if indices is None else indices
    with open(path, "w") as f:
        for i, grade in zip(indices, grades, strict=True):
            record = {"index": i, "prompt": f"q{i}", "gold": "1", "completion": "#### 1", "grade": grade}
            f.write(json.dumps(record) + "\n")


def test_gain_from_run_pairs_problems_by_index(tmp_path):
    before, after = table(40, 3, 9, both_right=10)
    before[0] = "unparseable"  # not right: problem 0 (right->wrong in the table) is now wrong both times
    write_records(tmp_path / "eval_before.jsonl", before)
    order = list(range(40))
    random.Random(0).shuffle(order)  # the after file in another order: pairing goes by index, not by line
    write_records(tmp_path / "eval_after.jsonl", [after[i] for i in order], indices=order)
    assert gain_from_run(tmp_path) == paired_gain(before, after)
    assert gain_from_run(tmp_path)["right_to_wrong"] == 2


def test_gain_from_run_is_none_without_both_files(tmp_path):
    assert gain_from_run(tmp_path) is None
    write_records(tmp_path / "eval_before.jsonl", ["correct", "wrong"])
    assert gain_from_run(tmp_path) is None
    (tmp_path / "eval_before.jsonl").rename(tmp_path / "eval_after.jsonl")
    assert gain_from_run(tmp_path) is None


def test_gain_from_run_refuses_mismatched_problem_sets(tmp_path):
    write_records(tmp_path / "eval_before.jsonl", ["correct"] * 4, indices=[0, 1, 2, 3])
    write_records(tmp_path / "eval_after.jsonl", ["correct"] * 4, indices=[0, 1, 2, 7])
    with pytest.raises(ValueError) as info:
        gain_from_run(tmp_path)
    message = str(info.value)
    assert "different problems" in message
    assert "1 only in eval_before.jsonl (index 3)" in message and "1 only in eval_after.jsonl (index 7)" in message

    write_records(tmp_path / "eval_after.jsonl", ["correct"] * 3, indices=[0, 1, 2])  # a shorter after set
    with pytest.raises(ValueError, match="1 only in eval_before.jsonl"):
        gain_from_run(tmp_path)


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"index": 0, "grade": "correct"}', '{"index": 0, "grade": "wrong"}'], "index 0 appears twice"),
        (['{"index": 0, "grade": "correct"}', "{not json"], "eval_after.jsonl:2 is not valid JSON"),
        (['{"index": 0, "completion": "x"}'], "no 'index' and 'grade'"),
        ([], "hold no graded problems"),
    ],
)
def test_gain_from_run_refuses_malformed_files(tmp_path, lines, expected):
    write_records(tmp_path / "eval_before.jsonl", ["correct"] * (1 if lines else 0))
    (tmp_path / "eval_after.jsonl").write_text("".join(line + "\n" for line in lines))
    with pytest.raises(ValueError, match=expected):
        gain_from_run(tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# Where users read it: summary.md, the plot, the model card


def summary_of(grades: list[str]) -> dict:
    counts = {g: grades.count(g) for g in ("correct", "wrong", "unparseable")}
    return {"accuracy": counts["correct"] / len(grades), **counts, "total": len(grades)}


def fake_run(out, before, after, *, jsonl=True, stored_gain=None):
    """A run directory as train.py leaves it, without the model: eval results, per-problem records, history."""
    out.mkdir(parents=True, exist_ok=True)
    results = {"before": summary_of(before), "after": summary_of(after)}
    if stored_gain is not None:
        results["gain"] = stored_gain
    (out / "eval_results.json").write_text(json.dumps(results))
    if jsonl:
        write_records(out / "eval_before.jsonl", before)
        write_records(out / "eval_after.jsonl", after)
    history = [
        {"step": s, "reward": 0.1 * s, "accuracy": 0.1 * s, "loss": 0.01 / s, "reward/min": 0.0, "reward/max": 1.0}
        for s in range(1, 6)
    ]
    (out / "training_history.json").write_text(json.dumps(history))
    return out


NOISY = table(200, 16, 23, both_right=64)  # 40.0% -> 43.5%, +3.5 points (95% CI -2.7 to +9.7)
CLEAR = table(200, 2, 30, both_right=60)  # 31.0% -> 45.0%, +14.0 points (95% CI +8.5 to +19.2)
NOISY_ROW = "| accuracy difference, paired | | | +3.5 points (95% CI -2.7 to +9.7) |"
NOISY_COUNTS = "| problems right → wrong / wrong → right | | | 16 / 23 |"


def test_summary_shows_interval_counts_and_verdict(tmp_path):
    out = fake_run(tmp_path / "noisy", *NOISY)
    report.write_report(out)
    summary = (out / "summary.md").read_text()
    assert "| accuracy | 40.0% | 43.5% | +3.5 points |" in summary
    assert NOISY_ROW in summary and NOISY_COUNTS in summary
    assert "The 95% interval of the difference includes zero" in summary and "excludes zero" not in summary
    assert "23 went wrong → right, 16 right → wrong" in summary
    table_end = summary.index(NOISY_COUNTS)
    assert summary.index("includes zero") > table_end  # the sentence follows the table

    clear = summary_markdown(RunResult.load(fake_run(tmp_path / "clear", *CLEAR)))
    assert "| accuracy difference, paired | | | +14.0 points (95% CI +8.5 to +19.2) |" in clear
    assert "| problems right → wrong / wrong → right | | | 2 / 30 |" in clear
    assert "excludes zero: on these 200 problems the gain is unlikely to be noise" in clear


def test_summary_prefers_the_stored_gain(tmp_path):
    """eval_results.json["gain"] wins over the jsonl files: here they differ in the counts, not in the accuracies."""
    before, after = NOISY
    stored = paired_gain(*table(200, 17, 24, both_right=63))  # same 40.0% -> 43.5% marginals
    out = fake_run(tmp_path / "run", before, after, stored_gain=stored)
    summary = summary_markdown(RunResult.load(out))
    assert "| 17 / 24 |" in summary and "| 16 / 23 |" not in summary

    out = fake_run(tmp_path / "stored_only", before, after, jsonl=False, stored_gain=paired_gain(before, after))
    assert NOISY_ROW in summary_markdown(RunResult.load(out))


def test_no_per_problem_records_leaves_the_interval_out(tmp_path):
    out = fake_run(tmp_path / "run", *NOISY, jsonl=False)
    report.write_report(out)
    summary = (out / "summary.md").read_text()
    assert "| accuracy | 40.0% | 43.5% | +3.5 points |" in summary
    assert "95% CI" not in summary and "paired" not in summary and "right → wrong" not in summary
    assert (out / "training_curves.png").stat().st_size > 10_000

    run = RunResult.load(out)
    figure = training_figure(run.history, run.evaluations)
    assert all(not ax.texts for ax in figure.axes) and all(not ax.containers for ax in figure.axes)


@pytest.mark.parametrize("problem", ["mismatched index sets", "records of another evaluation"])
def test_unusable_records_leave_the_interval_out_with_a_warning(tmp_path, caplog, problem):
    out = fake_run(tmp_path / "run", *NOISY)
    if problem == "mismatched index sets":
        write_records(out / "eval_after.jsonl", NOISY[1][:150])
    else:
        write_records(out / "eval_after.jsonl", CLEAR[1])  # 200 problems, but not the after results' grades
    with caplog.at_level(logging.WARNING, logger="hf_grpo.evaluation.stats"):
        report.write_report(out)
    summary = (out / "summary.md").read_text()
    assert "| accuracy | 40.0% | 43.5% | +3.5 points |" in summary and "95% CI" not in summary
    assert "no paired before/after interval" in caplog.text


def _accuracy_axis(figure):
    (ax,) = [ax for ax in figure.axes if ax.get_title() == "Accuracy: train vs held-out"]
    return ax


def test_figure_shows_the_difference_with_its_interval(tmp_path):
    out = fake_run(tmp_path / "run", *NOISY)
    run = RunResult.load(out)
    results, gain = run.evaluations, run.gain
    figure = training_figure(run.history, results, gain)
    ax = _accuracy_axis(figure)
    text = "\n".join(t.get_text() for t in ax.texts)
    assert "+3.5 pts" in text and "95% CI -2.7 to +9.7" in text and "16 right→wrong, 23 wrong→right" in text
    (bar,) = ax.containers  # the error bar at the last step spans before + ci95
    segment = bar.lines[2][0].get_segments()[0]
    low, high = gain["ci95"]
    assert segment[0][0] == segment[1][0] == 5  # x: the last step
    assert sorted(y for _, y in segment) == pytest.approx([0.40 + low, 0.40 + high])
    assert "95% CI of after - before, from before (dotted)" in [t.get_text() for t in ax.get_legend().get_texts()]
    # reward == accuracy, a 0..1 reward range and no length or entropy: every other panel would repeat or be flat
    assert [a.get_title() for a in figure.axes] == ["Accuracy: train vs held-out"]
    # eval_results["gain"] alone is enough, as plot_training receives it from a stored run
    stored = training_figure(run.history, {**results, "gain": gain})
    assert "95% CI -2.7 to +9.7" in "\n".join(t.get_text() for t in _accuracy_axis(stored).texts)


def test_model_card_shows_interval_counts_and_verdict(tmp_path):
    out = fake_run(tmp_path / "run", *NOISY)
    card = model_card(out, "me/tiny-grpo")
    assert NOISY_ROW in card and NOISY_COUNTS in card
    assert "The 95% interval of the difference includes zero" in card
    assert (
        "from 40.0% before training to 43.5% after, a paired difference of +3.5 points (95% CI -2.7 to +9.7)." in card
    )
    assert card.index(NOISY_COUNTS) < card.index("includes zero") < card.index("## Usage")

    clear = model_card(fake_run(tmp_path / "clear", *CLEAR), "me/tiny-grpo")
    assert "+14.0 points (95% CI +8.5 to +19.2)" in clear and "excludes zero" in clear

    bare = model_card(fake_run(tmp_path / "bare", *NOISY, jsonl=False), "me/tiny-grpo")
    assert "| accuracy | 40.0% | 43.5% | +3.5 points |" in bare
    assert "95% CI" not in bare and "paired difference" not in bare and "43.5% after." in bare
