"""Embedded GSM8K-style arithmetic word problems, generated in code (the default run's task, no download).

    >>> from hf_grpo.data.arithmetic import make_problem
    >>> import random
    >>> p = make_problem(random.Random(0))
    >>> p["answer"].splitlines()[-1].startswith("#### ")
    True

``split_of`` puts every question text in exactly one split, so train and held-out are disjoint (docs/data.md).
``make_split(..., two_step_share=...)`` mixes in two-operation problems (training phrasings, a worked line per step).
Two held-out sets are not only the training distribution: ``make_transfer_split`` (a third the training templates'
held-out questions, a third the same operations phrased differently, a third two operations in one problem) and
``make_reasoning_split`` (those three kinds plus three operations and a distractor number, a fifth each), all in
phrasings no training problem uses.
"""

from __future__ import annotations

import random
import zlib

from .held_out import distinct


NAMES = ["Tom", "Ana", "Sam", "Mia", "Leo", "Ivy", "Max", "Zoe"]
ITEMS = ["apples", "pens", "cards", "books", "coins", "shells"]

# operation -> question template
TEMPLATES = {
    "+": "{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have?",
    "-": "{name} has {a} {item}. {name} gives away {b}. How many {item} are left?",
}
# Two operations in the training templates' words (make_split's two_step_share); the held-out TWO_STEP below is
# phrased otherwise, so a gain there is transfer, not recall.
TRAIN_TWO_STEP = {
    ("+", "-"): "{name} has {a} {item}. {name} gets {b} more and then gives away {c}. How many {item} are left?",
    ("-", "+"): "{name} has {a} {item}. {name} gives away {b} and then gets {c} more. "
    "How many {item} does {name} have?",
    ("+", "+"): "{name} has {a} {item}. {name} gets {b} more and then {c} more. How many {item} does {name} have?",
}


# Held-out phrasings no training problem uses (make_transfer_split): other names, items and sentence shapes.
REPHRASED = {
    "+": "A box holds {a} {item}. {name} puts {b} more {item} into the box. How many {item} are in the box now?",
    "-": "There were {a} {item} on the shelf. {name} took {b} of them away. How many {item} are still on the shelf?",
}
TWO_STEP = {
    ("+", "-"): "{name} had {a} {item}, found {b} more and then lost {c}. How many {item} does {name} have now?",
    ("-", "+"): "{name} had {a} {item}, sold {b} and then bought {c} more. How many {item} does {name} have now?",
    ("+", "+"): "{name} has {a} {item}. A friend gives {b} more and a sister gives {c} more. How many {item} in all?",
}
THREE_STEP = (
    "{name} had {a} {item}. {name} found {b} more, gave {c} to a friend and then bought {d} more. "
    "How many {item} does {name} have now?"
)
# One operation answers it; the second number of the first sentence is about something else.
DISTRACTOR = {
    "+": "{name} has {a} {item} and {x} {other}. Later {name} buys {b} more {item}. How many {item} does {name} have?",
    "-": "{name} keeps {a} {item} in a jar and {x} {other} in a bag. {name} uses {b} of the {item}. "
    "How many {item} remain in the jar?",
}
OTHER_NAMES = ["Ruth", "Omar", "Lena", "Kofi", "Nina", "Yuki"]
OTHER_ITEMS = ["stamps", "marbles", "stickers", "beads", "tickets", "buttons"]
TRANSFER_KINDS = ("seen", "rephrased", "two_step")
REASONING_KINDS = (*TRANSFER_KINDS, "three_step", "distractor")


def split_of(question: str) -> str:
    """Assign a question to "train" or "test" from its text alone (about one in five is held out)."""
    return "test" if zlib.crc32(question.encode()) % 5 == 0 else "train"


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "+":
        return rng.randint(1, 9), rng.randint(1, 9)
    a = rng.randint(2, 18)
    return a, rng.randint(1, min(a - 1, 9))


def _one_step(rng: random.Random, templates: dict, names: list[str], items: list[str]) -> dict:
    op = rng.choice(list(templates))
    a, b = _operands(rng, op)
    question = templates[op].format(name=rng.choice(names), item=rng.choice(items), a=a, b=b)
    result = a + b if op == "+" else a - b
    return {"question": question, "answer": f"{a} {op} {b} = {result}\n#### {result}", "solution": str(result)}


def make_problem(rng: random.Random, split: str | None = None, two_step_share: float = 0.0) -> dict:
    """One problem as ``{"question", "answer", "solution"}``; ``answer`` is GSM8K-style (one worked line per
    operation, then ``#### N``), ``solution`` the number. With ``two_step_share`` > 0 that share of problems has two
    operations (``TRAIN_TWO_STEP``); at 0 the random draws, and so the problems, are those of one-step-only sets."""
    while True:
        two = two_step_share > 0 and rng.random() < two_step_share
        problem = _chain(rng, TRAIN_TWO_STEP, NAMES, ITEMS) if two else _one_step(rng, TEMPLATES, NAMES, ITEMS)
        if split is None or split_of(problem["question"]) == split:
            return problem


def make_split(split: str, n: int, seed: int, two_step_share: float = 0.0) -> list[dict]:
    """``n`` problems of one split ("train" or "test"), reproducible from ``seed``."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 0.0 <= two_step_share <= 1.0:
        raise ValueError(f"two_step_share must lie in [0, 1], got {two_step_share}")
    rng = random.Random(f"{split}-{seed}")
    if split == "test":  # held out: no problem twice (data/held_out.py)
        return distinct(lambda _: make_problem(rng, split, two_step_share), [None] * n, "the arithmetic test split")
    return [make_problem(rng, split, two_step_share) for _ in range(n)]


def corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Question and answer text used to train the tiny tokenizer (both splits, so no token is unseen)."""
    rng = random.Random(f"corpus-{seed}")
    texts = []
    for _ in range(n):
        p = make_problem(rng)
        texts += [p["question"], p["answer"]]
    return texts


def _steps(rng: random.Random, ops: tuple[str, ...]) -> tuple[list[int], str, int]:
    """Operands for a chain of operations, every count positive: (numbers, worked lines, result)."""
    a, b = _operands(rng, ops[0])
    numbers, lines, total = [a], [], a
    for op in ops:
        n = b if len(numbers) == 1 else rng.randint(1, 9) if op == "+" else rng.randint(1, min(total - 1, 9))
        result = total + n if op == "+" else total - n
        lines.append(f"{total} {op} {n} = {result}")
        numbers.append(n)
        total = result
    return numbers, "\n".join(lines), total


def _chain(rng: random.Random, templates: dict, names: list[str], items: list[str]) -> dict:
    ops = rng.choice(list(templates))  # a loss always follows a gain, so the count stays positive
    (a, b, c), lines, result = _steps(rng, ops)
    question = templates[ops].format(name=rng.choice(names), item=rng.choice(items), a=a, b=b, c=c)
    return {"question": question, "answer": f"{lines}\n#### {result}", "solution": str(result)}


def _two_step(rng: random.Random) -> dict:
    return _chain(rng, TWO_STEP, OTHER_NAMES, OTHER_ITEMS)


def _three_step(rng: random.Random) -> dict:
    (a, b, c, d), lines, result = _steps(rng, ("+", "-", "+"))
    question = THREE_STEP.format(name=rng.choice(OTHER_NAMES), item=rng.choice(OTHER_ITEMS), a=a, b=b, c=c, d=d)
    return {"question": question, "answer": f"{lines}\n#### {result}", "solution": str(result)}


def _distractor(rng: random.Random) -> dict:
    op = rng.choice(list(DISTRACTOR))
    a, b = _operands(rng, op)
    item, other = rng.sample(OTHER_ITEMS, 2)
    x = rng.randint(2, 19)
    question = DISTRACTOR[op].format(name=rng.choice(OTHER_NAMES), item=item, other=other, a=a, b=b, x=x)
    result = a + b if op == "+" else a - b
    return {"question": question, "answer": f"{a} {op} {b} = {result}\n#### {result}", "solution": str(result)}


def make_transfer_split(n: int, seed: int) -> list[dict]:
    """``n`` held-out problems, their ``kind`` cycling through ``TRANSFER_KINDS``: ``seen`` (the training templates,
    held-out questions only), ``rephrased`` (one operation, phrasings and words no training problem uses) and
    ``two_step`` (two operations in one problem). Reproducible from ``seed``."""
    rng = random.Random(f"transfer-{seed}")
    make = {
        "seen": lambda: make_problem(rng, "test"),
        "rephrased": lambda: _one_step(rng, REPHRASED, OTHER_NAMES, OTHER_ITEMS),
        "two_step": lambda: _two_step(rng),
    }
    return distinct(lambda kind: make[kind](), [TRANSFER_KINDS[i % 3] for i in range(n)], "arithmetic_transfer")


def make_reasoning_split(n: int, seed: int) -> list[dict]:
    """``n`` held-out problems, their ``kind`` cycling through ``REASONING_KINDS``: the three of
    ``make_transfer_split``, then ``three_step`` (three operations) and ``distractor`` (one operation beside a number
    that does not matter). Reproducible from ``seed``."""
    rng = random.Random(f"reasoning-{seed}")
    make = {
        "seen": lambda: make_problem(rng, "test"),
        "rephrased": lambda: _one_step(rng, REPHRASED, OTHER_NAMES, OTHER_ITEMS),
        "two_step": lambda: _two_step(rng),
        "three_step": lambda: _three_step(rng),
        "distractor": lambda: _distractor(rng),
    }
    kinds = [REASONING_KINDS[i % len(REASONING_KINDS)] for i in range(n)]
    return distinct(lambda kind: make[kind](), kinds, "arithmetic_reasoning")


HELD_OUT_SETS = {"arithmetic_transfer": make_transfer_split, "arithmetic_reasoning": make_reasoning_split}
