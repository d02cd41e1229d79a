"""Held-out sets without repeats. A problem that appears twice is graded the same way twice under greedy decoding, so
it counts twice in every accuracy and interval while it is one piece of evidence; two problems of one kind with the
same worked solution (the same numbers and operations) differ only in names and words. Every embedded held-out set is drawn through
``distinct``, and a hub or file held-out split is cleared of repeated prompts when it loads (``loaders``).

    >>> import random
    >>> rng = random.Random(0)
    >>> rows = distinct(lambda kind: {"question": f"{rng.randint(1, 3)} + {rng.randint(1, 3)}"}, [None] * 9, "sums")
    >>> len({r["question"] for r in rows})
    9
"""

from __future__ import annotations

import re
from collections.abc import Callable


NUMBER = re.compile(r"\d+")
MAX_DRAWS = 500  # draws for one problem before its kind counts as used up


def same_problem(problem: dict) -> tuple:
    """What makes two problems of one kind the same problem: their worked solution (``answer``: the numbers and
    the operations), else the whole numbers of the question in order."""
    return (
        (problem.get("answer"),)
        if problem.get("answer")
        else tuple(int(n) for n in NUMBER.findall(problem["question"]))
    )


def distinct(draw: Callable[[str | None], dict], kinds: list[str | None], what: str) -> list[dict]:
    """One problem per entry of ``kinds``, each from ``draw(kind)`` (``kind`` None: a set without kinds), no two with
    the same question and, within a kind, none that is the same problem (``same_problem``; a kind's problems get a
    ``kind`` field).
    ``ValueError`` naming ``what`` and the kind when the generator runs out of new ones."""
    texts, keys, problems = set(), set(), []
    for kind in kinds:
        for _ in range(MAX_DRAWS):
            problem = draw(kind)
            key = (kind, same_problem(problem))
            if problem["question"] not in texts and (kind is None or key not in keys):
                break
        else:
            have = sum(p.get("kind") == kind for p in problems) if kind is not None else len(problems)
            of = "" if kind is None else f" {kind!r}"
            raise ValueError(
                f"{what} has about {have} distinct{of} problems and {kinds.count(kind)} were asked for: lower "
                "arithmetic_eval_size (a repeated problem would count twice in every interval)"
            )
        texts.add(problem["question"])
        keys.add(key)
        problems.append(problem if kind is None else {**problem, "kind": kind})
    return problems
