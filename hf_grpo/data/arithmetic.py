"""Embedded GSM8K-style arithmetic word problems, generated in code (the default run's task, no download).

    >>> from hf_grpo.data.arithmetic import make_problem
    >>> import random
    >>> p = make_problem(random.Random(0))
    >>> p["answer"].splitlines()[-1].startswith("#### ")
    True

``split_of`` puts every question text in exactly one split, so train and held-out are disjoint (docs/data.md).
"""

from __future__ import annotations

import random
import zlib


NAMES = ["Tom", "Ana", "Sam", "Mia", "Leo", "Ivy", "Max", "Zoe"]
ITEMS = ["apples", "pens", "cards", "books", "coins", "shells"]

# (operation, question template, worked-line template)
TEMPLATES = {
    "+": "{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have?",
    "-": "{name} has {a} {item}. {name} gives away {b}. How many {item} are left?",
}


def split_of(question: str) -> str:
    """Assign a question to "train" or "test" from its text alone (about one in five is held out)."""
    return "test" if zlib.crc32(question.encode()) % 5 == 0 else "train"


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "+":
        return rng.randint(1, 9), rng.randint(1, 9)
    a = rng.randint(2, 18)
    return a, rng.randint(1, min(a - 1, 9))


def make_problem(rng: random.Random, split: str | None = None) -> dict:
    """One problem as ``{"question", "answer", "solution"}``; ``answer`` is GSM8K-style, ``solution`` the number."""
    while True:
        op = rng.choice(list(TEMPLATES))
        a, b = _operands(rng, op)
        question = TEMPLATES[op].format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b)
        if split is None or split_of(question) == split:
            break
    result = a + b if op == "+" else a - b
    answer = f"{a} {op} {b} = {result}\n#### {result}"
    return {"question": question, "answer": answer, "solution": str(result)}


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
