"""The completions ``benchmarks/rewards.py`` grades, built in code, and the one pathological completion.

``build(n)`` returns N realistic completions with their golds: half GSM8K-style, half MATH-style (reasoning then a
``####``, boxed or "The answer is" answer, about 55% right, 35% wrong and 10% unparseable), in the three shapes the
graders read: ``gsm8k`` and ``math`` (plain completions, the dataset's gold solution) and ``trl`` (conversational
completions and a ``\\boxed{answer}`` gold for every item, which is all TRL's ``accuracy_reward`` reads). The same
seed gives the same completions. No measurement here: run ``python benchmarks/rewards.py --help``.
"""

from __future__ import annotations

import random


# math-verify computes this factorial for ever (Math-Verify#65's power tower no longer reaches it: grading refuses
# powers of over MAX_POWER_DIGITS digits)
PATHOLOGICAL = r"\boxed{99999999999!}"


NAMES = ["Natalia", "James", "Maria", "Tom", "Aisha", "Wei", "Priya", "Carlos", "Janet", "Olga"]
ITEMS = ["apples", "clips", "pencils", "eggs", "books", "marbles", "stickers", "cupcakes"]


def _gsm8k_item(rng: random.Random) -> tuple[str, str, str]:
    """(completion, GSM8K gold, MATH-style gold for TRL), with a random answer format and outcome."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, price = rng.randint(2, 400), rng.randint(2, 60), rng.choice([1, 2, 3, 5, 12, 25])
    answer = (a + b) * price
    gold = f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.\nThey cost {a + b} * {price} = {answer}.\n#### {answer}"
    outcome = rng.choices(["correct", "wrong", "unparseable"], weights=[55, 35, 10])[0]
    value = answer if outcome == "correct" else answer + rng.choice([-price, price, -1, 10, a])
    steps = [
        f"{name} starts with {a} {item} and gets {b} more, so {a} + {b} = {a + b} {item}.",
        f"Each costs ${price}, so the total is {a + b} * {price} = {value}.",
    ]
    if rng.random() < 0.4:
        steps.insert(1, f"Let me double-check: {a + b} - {b} = {a}, which matches.")
    body = "\n".join(steps)
    if outcome == "unparseable":
        text = rng.choice(
            [
                f"{name} has some {item}. I am not sure how to work out the total cost.",
                f"We need the number of {item} first.\nThen multiply by the price.\n####",
                "Let's think step by step.",
            ]
        )
    else:
        shown = f"{value:,}" if value >= 1000 and rng.random() < 0.5 else str(value)
        text = rng.choice(
            [
                f"{body}\n#### {shown}",
                f"{body}\n#### ${shown}",
                f"{body}\n\nThe final answer is $\\boxed{{{shown}}}$.",
                f"{body}\nThe answer is {shown} dollars.",
                f"{body}\n**Answer:** {shown}",
                f"{body}\n#### {shown}\n\nQuestion: {rng.choice(NAMES)} has 5 {item} and buys 3 more.",
            ]
        )
    return text, gold, f"\\boxed{{{answer}}}"


# (gold, correct forms, wrong forms) of MATH answers
MATH_ANSWERS = [
    (r"\frac{1}{2}", [r"\frac{1}{2}", r"\dfrac12", "0.5", r"\frac{2}{4}"], [r"\frac{1}{3}", "2", "-0.5"]),
    (r"\frac{3}{4}", [r"\frac{3}{4}", r"\dfrac{3}{4}", "0.75"], [r"\frac{4}{3}", r"\frac{3}{8}"]),
    (r"2\sqrt{3}", [r"2\sqrt{3}", r"\sqrt{12}", r"2 \sqrt 3"], [r"3\sqrt{2}", r"\sqrt{6}"]),
    (r"\frac{\sqrt{3}}{2}", [r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"], [r"\frac{1}{2}", r"\sqrt{3}"]),
    (r"\frac{\pi}{6}", [r"\frac{\pi}{6}", r"\pi/6"], [r"\frac{\pi}{3}", r"\frac{\pi}{4}"]),
    ("12", ["12", "12.0", r"12 \text{ cm}"], ["13", "-12", "21"]),
    ("-7", ["-7", "-7.0"], ["7", "-6"]),
    ("(1, 2)", ["(1, 2)", "(1,2)"], ["(2, 1)", "(1, 3)"]),
    ("x^2 + 2x + 1", ["x^2 + 2x + 1", "(x+1)^2"], ["x^2 + 1", "x^2 - 2x + 1"]),
    ("10000", ["10000", "10{,}000", "10,\\!000"], ["1000", "100000"]),
    (r"\frac{5}{16}", [r"\frac{5}{16}", "0.3125"], [r"\frac{5}{8}", r"\frac{3}{16}"]),
    ("36", ["36", "6^2"], ["30", "216"]),
]


def _math_item(rng: random.Random) -> tuple[str, str, str]:
    """(completion, MATH gold solution, MATH gold for TRL)."""
    gold, right, wrong = rng.choice(MATH_ANSWERS)
    outcome = rng.choices(["correct", "wrong", "unparseable"], weights=[55, 35, 10])[0]
    x = rng.randint(2, 9)
    steps = [
        f"Let $f(x) = x^2 - {2 * x}x + {x * x}$. Completing the square, $f(x) = (x - {x})^2$.",
        f"Substituting $x = {x + 1}$ gives $f({x + 1}) = 1$, and the constraint $y \\le {x}$ still holds.",
        "By symmetry we only need to consider the case $a \\ge b$, which halves the work.",
        f"The equation $\\frac{{a}}{{b}} = {x}$ means $a = {x}b$, so we substitute into the second equation.",
    ]
    body = " ".join(rng.sample(steps, rng.randint(1, 4)))
    if rng.random() < 0.3:
        body = body + "\n\n" + body  # longer completions
    solution = f"We simplify the expression step by step. Therefore the answer is $\\boxed{{{gold}}}$."
    if outcome == "unparseable":
        return f"{body}\nI could not finish the computation.", solution, solution
    answer = rng.choice(right if outcome == "correct" else wrong)
    text = rng.choice(
        [
            f"{body}\nTherefore the answer is $\\boxed{{{answer}}}$.",
            f"{body}\n\\[\n\\boxed{{{answer}}}\n\\]",
            f"{body}\nFinal answer: $\\boxed{{{answer}}}$",
            f"{body}\nSo we get $\\boxed{{{rng.choice(wrong)}}}$. Wait, let me recheck. Actually it is $\\boxed{{{answer}}}$.",
        ]
    )
    return text, solution, solution


def build(n: int, seed: int = 0) -> dict:
    """N completions: the first half GSM8K-style, the second half MATH-style."""
    rng = random.Random(seed)
    gsm8k = [_gsm8k_item(rng) for _ in range(n // 2)]
    math = [_math_item(rng) for _ in range(n - n // 2)]
    return {
        "gsm8k": {"completions": [c for c, _, _ in gsm8k], "solution": [g for _, g, _ in gsm8k]},
        "math": {"completions": [c for c, _, _ in math], "solution": [g for _, g, _ in math]},
        "trl": {
            "completions": [[{"role": "assistant", "content": c}] for c, _, _ in gsm8k + math],
            "solution": [t for _, _, t in gsm8k + math],
        },
    }
