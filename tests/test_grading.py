"""Acceptance tests for answer grading (``hf_grpo.rewards.grading``): the grading table, grading errors,
``last_boxed``, ``to_number``, the doctests and a power tower. The reward functions built on it are in
test_reward_functions.py.

``GRADING_CASES`` is the table (its rows are in tests/helpers/grading_table_*.py): realistic completions (reasoning,
then an answer, the way models write them), each with its gold answer, task and the grade it must get. A change to the
grader that moves any row changes every number the project reports, so rows are only edited on purpose.
"""

from __future__ import annotations

import doctest
from fractions import Fraction

import pytest

from hf_grpo.rewards import functions, grading
from hf_grpo.rewards.grading import grade, last_boxed, to_number

from .helpers.grading_table_gsm8k import GSM8K_CASES
from .helpers.grading_table_math import MATH_CASES


GRADING_CASES = GSM8K_CASES + MATH_CASES


def test_table_is_big_enough():
    assert len(GRADING_CASES) >= 60
    ids = [c.id for c in GRADING_CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert {c.values[3] for c in GRADING_CASES} == set(grading.GRADES)


@pytest.mark.parametrize("completion, gold, task, expected", GRADING_CASES)
def test_grade(completion, gold, task, expected):
    assert grade(completion, gold, task) == expected


# ---------------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("task", ["GSM8K", "gsm8k ", "aime", ""])
def test_unknown_task_raises_naming_it(task):
    with pytest.raises(ValueError, match=f"unknown task {task!r}"):
        grade("#### 8", "#### 8", task)


@pytest.mark.parametrize("gold", ["#### ", "#### eight", "no number here", ""])
def test_unreadable_gsm8k_gold_raises(gold):
    with pytest.raises(ValueError, match="gold answer"):
        grade("#### 8", gold, "gsm8k")


def test_unreadable_math_gold_raises():
    with pytest.raises(ValueError, match="could not be parsed"):
        grade("\\boxed{5}", "", "math")


def test_gold_problem_raises_even_for_an_empty_completion():
    """A bad gold answer is a data problem: it is never turned into a grade, whatever the completion."""
    with pytest.raises(ValueError):
        grade("", "#### ", "gsm8k")


# ---------------------------------------------------------------------------------------------------- last_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("\\boxed{42}", "42", id="simple"),
        pytest.param("so \\boxed{1} and finally \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", id="last-of-several"),
        pytest.param("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}", id="nested-braces"),
        pytest.param("\\boxed{\\{1, \\{2\\}, 3\\}}", "\\{1, \\{2\\}, 3\\}", id="escaped-set-braces"),
        pytest.param(
            "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            id="matrix",
        ),
        pytest.param("\\boxed{ 7 }.", "7", id="stripped"),
        pytest.param("\\boxed {7}", "7", id="space-before-brace"),
        pytest.param("\\fbox{7}", "7", id="fbox"),
        pytest.param("\\boxed{3} then \\fbox{4}", "4", id="boxed-then-fbox"),
        pytest.param("\\boxed{}", "", id="empty"),
        pytest.param("no box here {5}", None, id="none"),
        pytest.param("\\boxed{1} and then \\boxed{\\frac{1}{2}", None, id="last-unclosed"),
        pytest.param("\\boxed 5 and later {6}", None, id="no-brace-after-boxed"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


# ----------------------------------------------------------------------------------------------------- to_number


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("18", Fraction(18), id="integer"),
        pytest.param("  -3 ", Fraction(-3), id="negative"),
        pytest.param("\u22125", Fraction(-5), id="unicode-minus"),
        pytest.param("18.00", Fraction(18), id="trailing-zeros"),
        pytest.param(".5", Fraction(1, 2), id="leading-dot"),
        pytest.param("-.25", Fraction(-1, 4), id="negative-leading-dot"),
        pytest.param("1,234", Fraction(1234), id="thousands"),
        pytest.param("1,234,567.5", Fraction(2469135, 2), id="millions-with-decimal"),
        pytest.param("$1,234.50", Fraction(2469, 2), id="money"),
        pytest.param("\\$18", Fraction(18), id="escaped-dollar"),
        pytest.param("-$18", Fraction(-18), id="negative-money"),
        pytest.param("10,\\!000", Fraction(10000), id="latex-negative-space-separator"),
        pytest.param("10{,}000", Fraction(10000), id="latex-brace-comma-separator"),
        pytest.param("10\\,000", Fraction(10000), id="latex-thin-space-separator"),
        pytest.param("25%", Fraction(25), id="percent"),
        pytest.param("18 cm", Fraction(18), id="unit"),
        pytest.param("3/4", Fraction(3, 4), id="slash-fraction"),
        pytest.param("3 / 4", Fraction(3, 4), id="slash-fraction-spaced"),
        pytest.param("1.5/3", Fraction(1, 2), id="slash-fraction-decimal-numerator"),
        pytest.param("\\frac{3}{4}", Fraction(3, 4), id="frac"),
        pytest.param("\\dfrac{3}{4}", Fraction(3, 4), id="dfrac"),
        pytest.param("\\tfrac{3}{4}", Fraction(3, 4), id="tfrac"),
        pytest.param("\\frac34", Fraction(3, 4), id="frac-no-braces"),
        pytest.param("\\frac{3}4", Fraction(3, 4), id="frac-half-braces"),
        pytest.param("-\\frac{3}{4}", Fraction(-3, 4), id="negative-frac"),
        pytest.param("\\frac{-3}{4}", Fraction(-3, 4), id="frac-negative-numerator"),
        pytest.param("72\n\\frac{1}{2} of the rest", Fraction(72), id="first-token-wins-over-later-frac"),
        pytest.param("\\frac{1}{2} and 72", Fraction(1, 2), id="first-token-frac"),
        pytest.param("3/0", None, id="zero-denominator"),
        pytest.param("\\frac{1}{0}", None, id="frac-zero-denominator"),
        pytest.param("", None, id="empty"),
        pytest.param("eighteen", None, id="words"),
        pytest.param("$", None, id="only-dollar"),
    ],
)
def test_to_number(text, expected):
    assert to_number(text) == expected


def test_to_number_is_exact():
    assert isinstance(to_number("0.1"), Fraction)
    assert to_number("0.1") + to_number("0.2") == to_number("0.3")


# --------------------------------------------------------------------------------------------------------- doctests


@pytest.mark.parametrize("module", [grading, functions], ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {module.__name__}"


PATHOLOGICAL = r"\boxed{\dfrac{5^{\left(5^{\left(5^{\left(5^5\right)}\right)} - 4\right)} - 5}{16}}"  # Math-Verify#65


def test_grade_called_directly_does_not_hang_on_a_power_tower(monkeypatch):
    """grade() itself computed for ever on Math-Verify#65's input (no process around it in a notebook).
    A power of over MAX_POWER_DIGITS digits never reaches SymPy: a boxed one is wrong, a gold one is refused."""
    import math_verify

    parsed, parse = [], math_verify.parse

    def parse_no_tower(text, *args, **kwargs):  # math-verify's parse, where SymPy would compute a tower for ever
        assert "5^{" not in text and "9^{" not in text, f"a power tower reached math-verify: {text}"
        parsed.append(text)
        return parse(text, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(math_verify, "parse", parse_no_tower)  # grading imports it from math_verify at each call
        assert grading.grade(PATHOLOGICAL, "1", "math") == "wrong"
        assert parsed == ["$1$"]  # the gold only: the completion was judged by its size, without SymPy
        with pytest.raises(ValueError, match="more than 1000000 digits"):
            grading.grade(r"\boxed{1}", r"9^{9^{9}}", "math")
        assert parsed == ["$1$"]  # the gold was refused by its size too
    # a tower in the reasoning does not hide the boxed answer; computable powers still grade
    assert grading.grade(r"Since 9^{9^{9}} is huge, \boxed{3}", "3", "math") == "correct"
    assert grading.grade(r"\boxed{2^{10}}", "1024", "math") == "correct"


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [(r"2^{10}", 3.0, 3.1), (r"2^{2^{2^{2}}}", 4.8, 4.9), (r"5^{5^{5}}", 2184, 2185), (r"x^2 + 3", 0, 0)],
)
def test_power_digits_estimates_a_towers_size(text, low, high):
    assert low <= grading.power_digits(text) <= high
    assert grading.power_digits(PATHOLOGICAL) == float("inf")
