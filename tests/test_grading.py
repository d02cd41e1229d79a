"""Acceptance tests for answer grading (``hf_grpo.rewards.grading``) and the reward functions built on it.

``GRADING_CASES`` is the table: realistic completions (reasoning, then an answer, the way models write them), each
with its gold answer, task and the grade it must get. A change to the grader that moves any row changes every number
the project reports, so rows are only edited on purpose.
"""

from __future__ import annotations

import doctest
import time
from fractions import Fraction

import pytest

from hf_grpo.rewards import functions, grading
from hf_grpo.rewards.functions import (
    REWARD_FUNCS,
    completion_text,
    gsm8k_correctness,
    hash_correctness,
    hash_format,
    length,
    math_correctness,
    r1_zero_correctness,
    r1_zero_format,
    soft_overlong,
    think_format,
)
from hf_grpo.rewards.grading import grade, last_boxed, to_number


def case(case_id: str, task: str, gold: str, expected: str, completion: str):
    return pytest.param(completion, gold, task, expected, id=f"{task}-{case_id}")


GSM8K_GOLD_72 = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)

GSM8K_CASES = [
    # ---- "####" answers
    case(
        "hash-reference-style",
        "gsm8k",
        GSM8K_GOLD_72,
        "correct",
        "Natalia sold 48 / 2 = <<48/2=24>>24 clips in May.\n"
        "Altogether she sold 48 + 24 = <<48+24=72>>72 clips.\n#### 72",
    ),
    case(
        "hash-no-space-trailing-dot",
        "gsm8k",
        "#### 72",
        "correct",
        "In May she sold half of 48, which is 24.\nSo in total 48 + 24 = 72.\n####72.",
    ),
    case(
        "hash-wrong",
        "gsm8k",
        GSM8K_GOLD_72,
        "wrong",
        "In May she sold 48 / 2 = 24 clips.\nAltogether she sold 48 - 24 = 24 clips.\n#### 24",
    ),
    case(
        "hash-thousands-separator",
        "gsm8k",
        "#### 1234",
        "correct",
        "He pays 1,000 for the laptop and 234 for the case.\n1,000 + 234 = 1,234\n#### 1,234",
    ),
    case(
        "hash-money-thousands-cents",
        "gsm8k",
        "#### 1234",
        "correct",
        "The rent is $1,000.00 and utilities are $234.00.\nTotal: $1,234.00\n#### $1,234.00",
    ),
    case(
        "hash-escaped-dollar",
        "gsm8k",
        "#### 18",
        "correct",
        "She sells 9 eggs at \\$2 each: 9 * 2 = 18.\n#### \\$18",
    ),
    case(
        "hash-last-one-counts",
        "gsm8k",
        "#### 12",
        "correct",
        "First guess:\n#### 10\nWait, I forgot the 2 extra pencils. 10 + 2 = 12.\n#### 12",
    ),
    case(
        "hash-then-rambling-continuation",
        "gsm8k",
        "#### 72",
        "correct",
        "48 + 24 = 72\n#### 72\n\nQuestion: Tom has 5 apples and buys 3 more. How many does he have?",
    ),
    case(
        "hash-cut-off-falls-back",
        "gsm8k",
        "#### 72",
        "correct",
        "She sold 24 clips in May, so the answer is 72.\n####",
    ),
    case(
        "hash-word-answer-no-digit-anywhere",
        "gsm8k",
        "#### 8",
        "unparseable",
        "She starts with three apples and buys five more, so she has eight.\n#### eight",
    ),
    # ---- \boxed{} answers
    case(
        "boxed-integer",
        "gsm8k",
        "#### 18",
        "correct",
        "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4, leaving 16 - 3 - 4 = 9.\n"
        "She sells them at $2 each: 9 * 2 = 18.\n\nThe final answer is $\\boxed{18}$.",
    ),
    case(
        "boxed-thousands-separator",
        "gsm8k",
        "#### 1234",
        "correct",
        "Adding the two amounts gives 1,234.\n\\boxed{1,234}",
    ),
    case(
        "boxed-money-cents",
        "gsm8k",
        "#### 1234.5",
        "correct",
        "The total cost is 1,000 + 234.50.\n\\[\n\\boxed{\\$1,234.50}\n\\]",
    ),
    case(
        "boxed-latex-thousands-separator",
        "gsm8k",
        "#### 10000",
        "correct",
        "Each of the 20 workers earns 500, so the total is 20 * 500.\n$\\boxed{10{,}000}$",
    ),
    case(
        "boxed-unit-text",
        "gsm8k",
        "#### 18",
        "correct",
        "The perimeter is 2 * (5 + 4) = 18.\n\\boxed{18 \\text{ cm}}",
    ),
    case(
        "boxed-frac",
        "gsm8k",
        "#### 0.75",
        "correct",
        "She ate 1/4 of the pie, so 1 - 1/4 of it is left.\n\\boxed{\\frac{3}{4}}",
    ),
    case(
        "boxed-dfrac",
        "gsm8k",
        "#### 0.75",
        "correct",
        "The fraction left is 3 out of 4.\n$\\boxed{\\dfrac{3}{4}}$",
    ),
    case(
        "boxed-frac-without-braces",
        "gsm8k",
        "#### 0.75",
        "correct",
        "So the answer is $\\boxed{\\frac34}$.",
    ),
    case(
        "boxed-negative-frac",
        "gsm8k",
        "#### -0.75",
        "correct",
        "The water level changes by -3 cm over 4 hours, that is\n$\\boxed{-\\frac{3}{4}}$ cm per hour.",
    ),
    case(
        "boxed-percent",
        "gsm8k",
        "#### 25",
        "correct",
        "The discount is 5 / 20 = 0.25 of the price.\nThat is \\boxed{25\\%}.",
    ),
    case(
        "boxed-several-last-counts",
        "gsm8k",
        "#### 8",
        "correct",
        "3 + 5 = 8 ... so \\boxed{6}? No wait, she never gave any away.\nSo the answer is \\boxed{8}.",
    ),
    case(
        "boxed-several-last-is-wrong",
        "gsm8k",
        "#### 8",
        "wrong",
        "3 + 5 = 8, so \\boxed{8}.\nHmm, actually she gives 2 to her brother: 8 - 2 = 6.\n\\boxed{6}",
    ),
    case(
        "boxed-beats-answer-is",
        "gsm8k",
        "#### 7",
        "correct",
        "At first I thought the answer is 5, but I missed two cookies.\n5 + 2 = 7\n\\boxed{7}",
    ),
    # ---- "The answer is" / "Answer:"
    case(
        "answer-is-after-intermediate-numbers",
        "gsm8k",
        "#### 18",
        "correct",
        "Each pack has 6 cans and he buys 3 packs.\n3 * 6 = 18\nThe answer is 18.",
    ),
    case(
        "answer-is-dollar",
        "gsm8k",
        "#### 18",
        "correct",
        "Each ticket is $6 and she buys 3 tickets: 3 * $6 = $18.\nThe answer is $18.",
    ),
    case(
        "answer-is-escaped-dollar-then-explanation",
        "gsm8k",
        "#### 18",
        "correct",
        "The answer is \\$18 (3 packs of 6 cans at \\$1 each).",
    ),
    case(
        "answer-is-bold-then-more-text",
        "gsm8k",
        "#### 18",
        "correct",
        "Adding it all up, the answer is **18**. We bought 3 packs, and 2 of them were on sale.",
    ),
    case(
        "answer-colon-bold-markdown",
        "gsm8k",
        "#### 42",
        "correct",
        "### Step 1\n6 boxes with 7 pencils each: 6 * 7 = 42\n\n**Answer:** 42 (6 boxes x 7 pencils)",
    ),
    case(
        "answer-is-latex-frac",
        "gsm8k",
        "#### 0.75",
        "correct",
        "She eats 1 of the 4 slices.\nThe answer is $\\frac{3}{4}$ of the pizza.",
    ),
    case(
        "answer-colon-slash-fraction",
        "gsm8k",
        "#### 0.75",
        "correct",
        "3 of the 4 marbles are red.\nAnswer: 3/4",
    ),
    case(
        "answer-is-trailing-zeros",
        "gsm8k",
        "#### 18",
        "correct",
        "6 * 3 = 18.00\nThe answer is 18.00",
    ),
    case(
        "answer-is-decimal-with-unit",
        "gsm8k",
        "#### 12.5",
        "correct",
        "Half of 25 is 12.5.\nThe answer is 12.50 dollars.",
    ),
    case(
        "answer-is-decimal-rounded-is-wrong",
        "gsm8k",
        "#### 12.5",
        "wrong",
        "Half of 25 is about 12.\nThe answer is 12.",
    ),
    case(
        "answer-is-unicode-minus",
        "gsm8k",
        "#### -5",
        "correct",
        "The temperature was 3 degrees and fell by 8: 3 − 8 = −5.\nThe answer is −5.",
    ),
    case(
        "answer-is-last-one-counts",
        "gsm8k",
        "#### 14",
        "correct",
        "I first thought the answer is 12, but Tom also brought 2 friends.\n12 + 2 = 14, so the answer is 14.",
    ),
    case(
        "answer-is-decimal-equals-fraction",
        "gsm8k",
        "#### 1/2",
        "correct",
        "She drank half of the bottle.\nThe answer is 0.5.",
    ),
    # ---- flexible extraction: the last number
    case(
        "flexible-last-number",
        "gsm8k",
        "#### 6",
        "correct",
        "She has 3 apples and buys 5 more, so 3 + 5 = 8.\nThen she gives away 2, leaving 6.",
    ),
    case(
        "flexible-unit-hours",
        "gsm8k",
        "#### 5",
        "correct",
        "He drives 300 miles at 60 miles per hour.\n300 / 60 = 5, so it takes 5 hours.",
    ),
    case(
        "flexible-money-in-words",
        "gsm8k",
        "#### 18",
        "correct",
        "She works 3 hours at 6 dollars an hour.\nSo she earns 18 dollars every day.",
    ),
    case(
        "flexible-money-thousands-cents",
        "gsm8k",
        "#### 1234",
        "correct",
        "Rent plus utilities come to $1,000.00 + $234.00.\nThe total is $1,234.00.",
    ),
    case(
        "flexible-percent",
        "gsm8k",
        "#### 25",
        "correct",
        "The price fell from $20 to $15, a drop of $5.\n5 / 20 = 0.25, so the discount is 25%.",
    ),
    case(
        "flexible-negative",
        "gsm8k",
        "#### -5",
        "correct",
        "It was 3 degrees in the morning and it dropped 8 degrees.\nThe temperature dropped to -5 degrees.",
    ),
    case(
        "flexible-negative-money",
        "gsm8k",
        "#### -18",
        "correct",
        "She had $12 and spent $30, so her balance is 12 - 30, i.e. she is at -$18.",
    ),
    case(
        "flexible-latex-thin-space-separator",
        "gsm8k",
        "#### 2000",
        "correct",
        "Each of the 4 stands seats 500 people, so $4 \\times 500 = 2\\,000$ people.",
    ),
    case(
        "flexible-latex-frac",
        "gsm8k",
        "#### 0.75",
        "correct",
        "Out of 4 slices, 1 was eaten, so she still has $\\frac{3}{4}$",
    ),
    case(
        "flexible-whole-string-gold",
        "gsm8k",
        "72",
        "correct",
        "In May she sold 24 clips, and in April 48.\n48 + 24 = 72",
    ),
    # ---- wrong and unparseable
    case(
        "chatty-gold-in-reasoning-final-wrong",
        "gsm8k",
        "#### 18",
        "wrong",
        "Let's think step by step. She buys 18 apples.\nShe gives 5 to her friend: 18 - 5 = 13.\nThe answer is 13.",
    ),
    case(
        "chatty-flexible-final-wrong",
        "gsm8k",
        "#### 8",
        "wrong",
        "She has 3 apples, buys 5 more, so 3 + 5 = 8. Then she gives away 2, leaving 6.",
    ),
    case(
        "no-answer-at-all",
        "gsm8k",
        "#### 72",
        "unparseable",
        "I'm not sure how to solve this problem. Could you give me more details about the clips?",
    ),
    case("empty", "gsm8k", "#### 72", "unparseable", ""),
    case("whitespace-only", "gsm8k", "#### 72", "unparseable", "  \n\n  "),
    case(
        "empty-boxed-no-digits",
        "gsm8k",
        "#### 72",
        "unparseable",
        "Let me put the answer here: \\boxed{}",
    ),
]

MATH_GOLD_HALF = "The probability is $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$."

MATH_CASES = [
    # ---- numbers, fractions, roots
    case(
        "boxed-integer",
        "math",
        "The number of ways is $\\binom{4}{2} = \\boxed{6}$.",
        "correct",
        "We choose 2 of the 4 people, order does not matter.\n$$\\binom{4}{2} = \\frac{4 \\cdot 3}{2} = 6$$\n"
        "The answer is $\\boxed{6}$.",
    ),
    case(
        "boxed-frac-vs-decimal-gold",
        "math",
        "\\boxed{0.5}",
        "correct",
        "There are 2 favourable outcomes out of 4.\nSo the probability is $\\boxed{\\frac{1}{2}}$.",
    ),
    case(
        "boxed-decimal-vs-frac-gold",
        "math",
        MATH_GOLD_HALF,
        "correct",
        "2 of the 4 outcomes work, so the probability is $\\boxed{0.5}$.",
    ),
    case(
        "boxed-frac-without-braces",
        "math",
        MATH_GOLD_HALF,
        "correct",
        "Two of four outcomes are favourable, hence\n\\[ P = \\boxed{\\frac12}. \\]",
    ),
    case(
        "boxed-dfrac",
        "math",
        "\\boxed{\\frac{3}{4}}",
        "correct",
        "The area ratio is $\\left(\\frac{\\sqrt3}{2}\\right)^2$, therefore\nthe answer is $\\boxed{\\dfrac{3}{4}}$.",
    ),
    case(
        "boxed-negative-frac-forms",
        "math",
        "\\boxed{-\\frac13}",
        "correct",
        "Solving $3x + 1 = 0$ gives $x = \\boxed{\\frac{-1}{3}}$.",
    ),
    case(
        "boxed-rounded-decimal-is-wrong",
        "math",
        "\\boxed{\\frac{1}{3}}",
        "wrong",
        "One of the three cards is red, which is approximately $\\boxed{0.333}$.",
    ),
    case(
        "boxed-sqrt-without-braces",
        "math",
        "The diagonal is $\\boxed{\\sqrt{2}}$.",
        "correct",
        "By Pythagoras the diagonal of the unit square is\n$d = \\boxed{\\sqrt2}$",
    ),
    case(
        "boxed-simplified-sqrt",
        "math",
        "\\boxed{\\sqrt{8}}",
        "correct",
        "The distance is $\\sqrt{2^2 + 2^2} = \\sqrt{8}$, which simplifies to\n$\\boxed{2\\sqrt{2}}$.",
    ),
    case(
        "boxed-sqrt-over-two",
        "math",
        "\\boxed{\\frac{\\sqrt3}{2}}",
        "correct",
        "Since the angle is $60^\\circ$, $\\sin 60^\\circ = \\boxed{\\frac{\\sqrt{3}}{2}}$.",
    ),
    case(
        "boxed-pi",
        "math",
        "\\boxed{\\frac{\\pi}{6}}",
        "correct",
        "The arc subtends $30^\\circ$, i.e. $\\frac{30}{180}\\pi$ radians.\nThe answer is $\\boxed{\\frac{\\pi}{6}}$.",
    ),
    case(
        "boxed-pi-approximation-is-wrong",
        "math",
        "\\boxed{\\pi}",
        "wrong",
        "The area of the unit circle is $\\pi r^2$ with $r = 1$, about\n$\\boxed{3.14}$",
    ),
    case(
        "boxed-thousands-separator-vs-math-gold",
        "math",
        "The total is $\\boxed{10,\\!000}$.",
        "correct",
        "Multiplying, $100 \\times 100 = 10{,}000$, so the total is $\\boxed{10{,}000}$.",
    ),
    case(
        "boxed-plain-vs-math-thousands-gold",
        "math",
        "The total is $\\boxed{10,\\!000}$.",
        "correct",
        "Multiplying, $100 \\times 100 = 10000$.\nFinal answer: $\\boxed{10000}$",
    ),
    case(
        "boxed-money",
        "math",
        "\\boxed{\\$5.50}",
        "correct",
        "Two coffees at \\$2.75 each cost $2 \\times 2.75 = 5.5$ dollars, so $\\boxed{5.5}$.",
    ),
    case(
        "boxed-unit-text",
        "math",
        "\\boxed{18}",
        "correct",
        "The perimeter is $2(5 + 4) = 18$.\nThe answer is \\boxed{18 \\text{ cm}}",
    ),
    case(
        "boxed-degrees",
        "math",
        "\\boxed{30^\\circ}",
        "correct",
        "The angles sum to $180^\\circ$, so the third angle is $180 - 150 = \\boxed{30^\\circ}$.",
    ),
    case(
        "boxed-percent-vs-plain-gold",
        "math",
        "\\boxed{50}",
        "correct",
        "Half of the students passed, which is $\\boxed{50\\%}$.",
    ),
    case(
        "boxed-complex",
        "math",
        "\\boxed{3i-2}",
        "correct",
        "Multiplying out, $(1 + 2i)(1 + i) = 1 + 3i + 2i^2 = -1 + 3i$; subtracting 1 gives\n\\[ \\boxed{-2 + 3i} \\]",
    ),
    case(
        "boxed-infinity",
        "math",
        "\\boxed{\\infty}",
        "correct",
        "The partial sums grow without bound, so the sum is $\\boxed{\\infty}$.",
    ),
    # ---- expressions, equations, text
    case(
        "boxed-polynomial-expanded",
        "math",
        "\\boxed{(x+1)^2}",
        "correct",
        "Expanding the square, we get\n$$\\boxed{x^2+2x+1}$$",
    ),
    case(
        "boxed-equation-vs-expression-gold",
        "math",
        "\\boxed{2x+3}",
        "correct",
        "The slope is 2 and the intercept is 3, so the line is $\\boxed{y = 2x + 3}$.",
    ),
    case(
        "boxed-text-day",
        "math",
        "\\boxed{\\text{Monday}}",
        "correct",
        "Day 0 is Friday and $17 \\equiv 3 \\pmod 7$, so it falls on $\\boxed{\\text{Monday}}$.",
    ),
    case(
        "boxed-text-day-wrong",
        "math",
        "\\boxed{\\text{Monday}}",
        "wrong",
        "Day 0 is Friday and $18 \\equiv 4 \\pmod 7$, so it falls on $\\boxed{\\text{Tuesday}}$.",
    ),
    case(
        "boxed-multiple-choice",
        "math",
        "\\boxed{\\text{(C)}}",
        "correct",
        "Only option (C) satisfies both conditions.\nThe answer is $\\boxed{\\text{(C)}}$.",
    ),
    # ---- tuples, intervals, sets, matrices
    case(
        "left-right-tuple-no-box",
        "math",
        "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}",
        "correct",
        "We have $r = \\sqrt{0^2 + 3^2} = 3$ and $\\theta = \\frac{\\pi}{2}$.\n"
        "Final answer: $\\left( 3, \\frac{\\pi}{2} \\right)$",
    ),
    case(
        "ordered-pair-swapped-is-wrong",
        "math",
        "\\boxed{(2,-1)}",
        "wrong",
        "Solving the system gives $x = 2$ and $y = -1$, so the point is $\\boxed{(-1, 2)}$.",
    ),
    case(
        "interval-half-open",
        "math",
        "\\boxed{(-\\infty,2]}",
        "correct",
        "The inequality $x \\le 2$ holds for every real $x$ up to 2.\nSo the solution set is $\\boxed{(-\\infty, 2]}$.",
    ),
    case(
        "interval-wrong-endpoint",
        "math",
        "\\boxed{(-\\infty,2]}",
        "wrong",
        "The inequality is strict, so the solution set is $\\boxed{(-\\infty, 2)}$.",
    ),
    case(
        "interval-with-x-in",
        "math",
        "\\boxed{[2,5)}",
        "correct",
        "Both conditions hold together when $\\boxed{x \\in [2, 5)}$.",
    ),
    case(
        "set-braces-vs-list-gold",
        "math",
        "\\boxed{1, 2, 3}",
        "correct",
        "The roots of $(x-1)(x-2)(x-3)$ are $\\boxed{\\{1, 2, 3\\}}$.",
    ),
    case(
        "list-in-another-order",
        "math",
        "\\boxed{5, 3}",
        "correct",
        "Factoring, $(x - 3)(x - 5) = 0$, so the solutions are $\\boxed{3, 5}$.",
    ),
    case(
        "matrix",
        "math",
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
        "correct",
        "Multiplying the two matrices entry by entry, we obtain\n"
        "$$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$$",
    ),
    case(
        "matrix-one-entry-wrong",
        "math",
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
        "wrong",
        "The product is $\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}}$.",
    ),
    case(
        "column-vector",
        "math",
        "\\boxed{\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}}",
        "correct",
        "Projecting onto the line gives\n\\[\\boxed{\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}}\\]",
    ),
    # ---- several boxes
    case(
        "several-boxes-last-counts",
        "math",
        "\\boxed{7}",
        "correct",
        "So $x = \\boxed{5}$. Wait, actually, I dropped a sign: $x = 5 + 2 = \\boxed{7}$.",
    ),
    case(
        "several-boxes-last-counts-without-dollars",
        "math",
        "\\boxed{7}",
        "correct",
        "Plugging in gives \\boxed{5}. Wait, actually, I dropped the +2, so it is \\boxed{7}",
    ),
    case(
        "several-boxes-in-separate-envs",
        "math",
        "\\boxed{7}",
        "correct",
        "First attempt: $\\boxed{5}$.\n\nChecking again, the constant term is 2 more, so $\\boxed{7}$.",
    ),
    case(
        "several-boxes-last-is-wrong",
        "math",
        "\\boxed{7}",
        "wrong",
        "So $x = \\boxed{7}$. Hmm, let me double-check... no, the answer is $\\boxed{5}$.",
    ),
    case(
        "answer-split-over-boxes",
        "math",
        "\\boxed{-2, 3}",
        "correct",
        "Factoring, $(x + 2)(x - 3) = 0$. The solutions are $\\boxed{-2}$ and $\\boxed{3}$.",
    ),
    # ---- no box
    case(
        "minerva-final-answer",
        "math",
        "\\boxed{5}",
        "correct",
        "Solution: $2x + 3 = 13$, so $x = 5$.\nFinal Answer: The final answer is $5$. I hope it is correct.",
    ),
    case(
        "answer-is-no-box",
        "math",
        "\\boxed{18}",
        "correct",
        "The perimeter is $2(5 + 4) = 18$.\nThe answer is 18.",
    ),
    case(
        "no-anchor-is-unparseable",
        "math",
        "\\boxed{18}",
        "unparseable",
        "Adding the sides gives 18. I think it is 18.",
    ),
    case(
        "chatty-gold-in-reasoning-final-wrong",
        "math",
        "\\boxed{4}",
        "wrong",
        "If $x = 4$ then $x^2 = 16$, which is too big, so we need a smaller value.\nTherefore $\\boxed{5}$.",
    ),
    case(
        "truncated-box",
        "math",
        "\\boxed{5}",
        "unparseable",
        "We compute the sum step by step and obtain $\\boxed{5",
    ),
    case(
        "no-answer-at-all",
        "math",
        "\\boxed{5}",
        "unparseable",
        "I cannot determine the value of $x$ from the given information.",
    ),
    case("empty", "math", "\\boxed{5}", "unparseable", ""),
]

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


# --------------------------------------------------------------------------------------------- reward functions


class MetricLog:
    def __init__(self):
        self.values: dict[str, float] = {}

    def __call__(self, name: str, value: float) -> None:
        assert name not in self.values, f"{name} logged twice"
        self.values[name] = value


def conversational(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def assert_grade_metrics(log: MetricLog, correct: float, wrong: float, unparseable: float) -> None:
    assert set(log.values) == {"accuracy", "grade/wrong", "grade/unparseable"}
    assert log.values["accuracy"] == pytest.approx(correct)
    assert log.values["grade/wrong"] == pytest.approx(wrong)
    assert log.values["grade/unparseable"] == pytest.approx(unparseable)
    assert sum(log.values.values()) == pytest.approx(1.0)


def test_completion_text():
    assert completion_text("plain") == "plain"
    assert completion_text(conversational("hi")) == "hi"
    messages = [
        {"role": "assistant", "content": "<think>a</think>"},
        {"role": "tool", "content": "IGNORED"},
        {"role": "assistant", "content": " 4"},
        {"content": "!"},  # no role: assistant
    ]
    assert completion_text(messages) == "<think>a</think> 4!"


def test_reward_funcs_registry():
    assert set(REWARD_FUNCS) == {
        "gsm8k_correctness",
        "hash_correctness",
        "math_correctness",
        "r1_zero_correctness",
        "r1_zero_format",
        "think_format",
        "hash_format",
        "hash_final_format",
        "length",
        "soft_overlong",
    }
    assert all(fn.__name__ == name for name, fn in REWARD_FUNCS.items())


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_gsm8k_correctness(wrap):
    completions = [
        wrap("3 + 4 = 7\n#### 7"),
        wrap("The answer is $1,234.00."),
        wrap("3 + 4 = 8\n#### 8"),
        wrap("I don't know."),
    ]
    log = MetricLog()
    rewards = gsm8k_correctness(
        completions, solution=["#### 7", "#### 1234", "#### 7", "#### 7"], log_metric=log, prompts=["p"] * 4
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert_grade_metrics(log, correct=0.5, wrong=0.25, unparseable=0.25)


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_hash_correctness_pays_only_for_the_answer_after_the_last_hashes(wrap):
    """What gsm8k_correctness reads anywhere (a last number, "the answer is"), this one does not: a policy that
    rambles to the token limit and ends on a lucky number gets nothing."""
    completions = [
        wrap("3 + 4 = 7\n#### 7"),
        wrap("3 + 4 = 7, so she has 7 apples and then"),  # right last number, unmarked
        wrap("The answer is 7."),
        wrap("#### 8\nno wait\n#### 7"),  # the last '####' counts
        wrap("#### 7\n#### 8"),
        wrap("3 + 4 = 7 ####"),  # '####' with no number after it: not read from before it
    ]
    gold = ["#### 7"] * 6
    log = MetricLog()
    assert hash_correctness(completions, solution=gold, log_metric=log) == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert gsm8k_correctness(completions, solution=gold) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert_grade_metrics(log, correct=2 / 6, wrong=1 / 6, unparseable=3 / 6)


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_math_correctness(wrap):
    completions = [
        wrap("So the probability is $\\boxed{\\frac{1}{2}}$."),
        wrap("The answer is $\\boxed{\\frac12}$."),
        wrap("Hence $\\boxed{3}$."),
        wrap("Hmm."),
        wrap(""),
    ]
    log = MetricLog()
    rewards = math_correctness(completions, solution=["The answer is \\boxed{0.5}."] * 5, log_metric=log)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert_grade_metrics(log, correct=0.4, wrong=0.2, unparseable=0.4)


def test_correctness_without_log_metric_and_with_no_completions():
    assert gsm8k_correctness(["#### 7"], solution=["#### 7"]) == [1.0]
    log = MetricLog()
    assert gsm8k_correctness([], solution=[], log_metric=log) == []
    assert log.values == {}  # nothing to average over: no metric rather than a division by zero


def test_correctness_needs_one_solution_per_completion():
    with pytest.raises(ValueError):
        gsm8k_correctness(["#### 7", "#### 8"], solution=["#### 7"])


def test_correctness_propagates_bad_gold():
    with pytest.raises(ValueError, match="gold answer"):
        gsm8k_correctness(["#### 7"], solution=["no number"])


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_r1_zero_correctness(wrap):
    completions = [
        wrap("<think>1 + 1 = 2</think> <answer>2</answer>"),
        wrap("<think>\nhalf of 4\n</think>\n<answer>\\frac{4}{2}</answer>\n"),
        wrap("<think>1 + 1 = 3</think> <answer>3</answer>"),
        wrap("<think>no answer tag</think> 2"),
        wrap("2"),
        wrap("<think>x</think> <answer></answer>"),
        wrap(" 1 + 1 = 2 </think> <answer> 2 </answer>"),  # r1_zero's prompt ends with <think>
    ]
    log = MetricLog()
    rewards = r1_zero_correctness(completions, solution=["$\\boxed{2}$"] * 7, log_metric=log)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert_grade_metrics(log, correct=3 / 7, wrong=1 / 7, unparseable=3 / 7)


def test_r1_zero_prompt_and_reward_agree():
    """The r1_zero prompt opens <think>, so a right completion written after it must earn the reward."""
    from hf_grpo.data.loaders import DataArguments, format_prompt

    prompt = format_prompt("What is 1 + 1?", DataArguments(prompt_style="r1_zero"))
    assert prompt.rstrip().endswith("<think>")
    assert r1_zero_correctness([" 1 + 1 = 2 </think> <answer> 2 </answer>"], solution=["\\boxed{2}"]) == [1.0]
    assert r1_zero_format([" 1 + 1 = 2 </think> <answer> 2 </answer>"]) == [1.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("<think>x</think> <answer>1</answer>", 1.0, id="ok"),
        pytest.param("\n<think>\nlong\nreasoning\n</think>\n\n<answer>\n1\n</answer>\n", 1.0, id="ok-newlines"),
        pytest.param("<think>x</think><answer>1</answer>", 1.0, id="ok-no-space"),
        pytest.param(" x </think> <answer>1</answer>", 1.0, id="think-opened-by-the-prompt"),
        pytest.param("x </think> y </think> <answer>1</answer>", 1.0, id="opened-by-prompt-two-closings"),
        pytest.param("<answer>1</answer>", 0.0, id="no-think"),
        pytest.param("<think>x</think> 1", 0.0, id="no-answer"),
        pytest.param("<think>x</think> <answer>1</answer> Hope this helps!", 0.0, id="text-after-answer"),
        pytest.param("Sure! <think>x</think> <answer>1</answer>", 0.0, id="text-before-think"),
        pytest.param("<think>x <answer>1</answer>", 0.0, id="unclosed-think"),
        pytest.param("", 0.0, id="empty"),
    ],
)
def test_r1_zero_format(text, expected):
    assert r1_zero_format([text]) == [expected]
    assert r1_zero_format([conversational(text)]) == [expected]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("<think>plan</think> 4", 1.0, id="ok"),
        pytest.param("  <think>\nplan\n</think>\nThe answer is 4.", 1.0, id="ok-leading-whitespace"),
        pytest.param("<think>plan</think>", 1.0, id="ok-nothing-after"),
        pytest.param("4 <think>late</think>", 0.0, id="think-not-first"),
        pytest.param("<think>a</think> <think>b</think> 4", 0.0, id="two-think-blocks"),
        pytest.param("<think>never closed", 0.0, id="unclosed"),
        pytest.param("The answer is 4.", 0.0, id="no-think"),
        pytest.param("", 0.0, id="empty"),
    ],
)
def test_think_format(text, expected):
    assert think_format([text]) == [expected]
    assert think_format([conversational(text)]) == [expected]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("7 + 1 = 8\n#### 8", 1.0, id="ok"),
        pytest.param("####8", 1.0, id="ok-no-space"),
        pytest.param("#### -3", 1.0, id="ok-negative"),
        pytest.param("#### $1,234", 1.0, id="ok-money"),
        pytest.param("The answer is 8.", 0.0, id="no-hashes"),
        pytest.param("#### eight", 0.0, id="no-number-after-hashes"),
        pytest.param("8\n####", 0.0, id="hashes-at-end"),
        pytest.param("", 0.0, id="empty"),
    ],
)
def test_hash_format(text, expected):
    assert hash_format([text]) == [expected]
    assert hash_format([conversational(text)]) == [expected]


def test_length():
    texts = ["x" * n for n in (0, 50, 51, 499, 500)]
    assert length(texts) == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert length([conversational("x" * 60)]) == [1.0]
    assert length(["x" * 10, "x" * 20], min_chars=5, max_chars=15) == [1.0, 0.0]


def test_soft_overlong():
    # DAPO: 0 up to max_len - cache tokens, then (max_len - cache - len) / cache, and -1 from max_len on.
    ids = [[0] * n for n in (0, 8, 10, 12, 14, 16, 40)]
    assert soft_overlong(ids, max_completion_len=16, cache=8) == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert soft_overlong([[0] * 16], max_completion_len=16, cache=16) == [-1.0]
    assert soft_overlong([[0] * 15, [0] * 16], max_completion_len=16, cache=1, completions=["a", "b"]) == [0.0, -1.0]


@pytest.mark.parametrize("cache", [0, -1, 17])
def test_soft_overlong_rejects_bad_cache(cache):
    with pytest.raises(ValueError, match="cache"):
        soft_overlong([[0]], max_completion_len=16, cache=cache)


# --------------------------------------------------------------------------------------------------------- doctests


@pytest.mark.parametrize("module", [grading, functions], ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {module.__name__}"


PATHOLOGICAL = r"\boxed{\dfrac{5^{\left(5^{\left(5^{\left(5^5\right)}\right)} - 4\right)} - 5}{16}}"  # Math-Verify#65


def test_grade_called_directly_does_not_hang_on_a_power_tower():
    """grade() itself computed for ever on Math-Verify#65's input (no process around it in a notebook).
    A power of over MAX_POWER_DIGITS digits never reaches SymPy: a boxed one is wrong, a gold one is refused."""
    start = time.monotonic()
    assert grading.grade(PATHOLOGICAL, "1", "math") == "wrong"
    assert time.monotonic() - start < 20
    with pytest.raises(ValueError, match="more than 1000000 digits"):
        grading.grade(r"\boxed{1}", r"9^{9^{9}}", "math")
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
