"""The GSM8K rows of the grading table (``tests/test_grading.py``): realistic completions, each with its gold answer,
task and the grade it must get, and ``case``, which makes a row."""

from __future__ import annotations

import pytest


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
