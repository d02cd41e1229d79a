"""Embedded GSM8K-style arithmetic word problems, generated in code (the default run's task, no download).

    >>> from hf_grpo.data.arithmetic import make_problem
    >>> import random
    >>> p = make_problem(random.Random(0))
    >>> p["answer"].splitlines()[-1].startswith("#### ")
    True

``split_of`` puts every question text in exactly one split, so train and held-out are disjoint (docs/data.md).
``make_transfer_split`` is a held-out set that is not only the training distribution: a third the training
templates' held-out questions, a third the same operations phrased differently, a third two operations in one problem.
"""

from __future__ import annotations

import random
import zlib


NAMES = ["Tom", "Ana", "Sam", "Mia", "Leo", "Ivy", "Max", "Zoe"]
ITEMS = ["apples", "pens", "cards", "books", "coins", "shells"]

# operation -> question template
TEMPLATES = {
    "+": "{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have?",
    "-": "{name} has {a} {item}. {name} gives away {b}. How many {item} are left?",
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
OTHER_NAMES = ["Ruth", "Omar", "Lena", "Kofi", "Nina", "Yuki"]
OTHER_ITEMS = ["stamps", "marbles", "stickers", "beads", "tickets", "buttons"]
TRANSFER_KINDS = ("seen", "rephrased", "two_step")


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


def make_problem(rng: random.Random, split: str | None = None) -> dict:
    """One problem as ``{"question", "answer", "solution"}``; ``answer`` is GSM8K-style, ``solution`` the number."""
    while True:
        problem = _one_step(rng, TEMPLATES, NAMES, ITEMS)
        if split is None or split_of(problem["question"]) == split:
            return problem


def make_split(split: str, n: int, seed: int) -> list[dict]:
    """``n`` problems of one split ("train" or "test"), reproducible from ``seed``."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{split}-{seed}")
    return [make_problem(rng, split) for _ in range(n)]


def corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Question and answer text used to train the tiny tokenizer (both splits, so no token is unseen)."""
    rng = random.Random(f"corpus-{seed}")
    texts = []
    for _ in range(n):
        p = make_problem(rng)
        texts += [p["question"], p["answer"]]
    return texts


def _two_step(rng: random.Random) -> dict:
    ops = rng.choice(list(TWO_STEP))  # a loss always follows a gain, so the count stays positive
    a, b = _operands(rng, ops[0])
    first = a + b if ops[0] == "+" else a - b
    c = rng.randint(1, 9) if ops[1] == "+" else rng.randint(1, min(first - 1, 9))
    result = first + c if ops[1] == "+" else first - c
    question = TWO_STEP[ops].format(name=rng.choice(OTHER_NAMES), item=rng.choice(OTHER_ITEMS), a=a, b=b, c=c)
    answer = f"{a} {ops[0]} {b} = {first}\n{first} {ops[1]} {c} = {result}\n#### {result}"
    return {"question": question, "answer": answer, "solution": str(result)}


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
    return [{**make[kind](), "kind": kind} for kind in (TRANSFER_KINDS[i % 3] for i in range(n))]
