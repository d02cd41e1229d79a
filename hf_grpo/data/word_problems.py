"""Embedded word problems with all four operations, several phrasings of each, one to three steps and numbers that
do not matter (``word_problems``), and a held-out set whose kinds training never sees (``word_problems_held_out``).

    >>> from hf_grpo.data.word_problems import make_train, make_held_out
    >>> problem = make_train(1, seed=0)[0]
    >>> problem["answer"].splitlines()[-1] == f"#### {problem['solution']}"
    True
    >>> sorted({p["kind"] for p in make_held_out(12, seed=0)}) == sorted(HELD_OUT_KINDS)
    True

Training problems tell a story about one person's things: a count that grows (gets, finds, buys), shrinks (gives,
eats, loses), is multiplied (packs of, rows of, each of) or shared (equally into, among), step after step, or falls
short of a goal (how many more), with a worked line per operation and ``#### N`` last, the answer format the
real-model recipes ask for. No word decides the operation: "splits into" starts as many products as quotients,
"shares among" and "puts into" also start products, "packs of" also asks a quotient, and "more" also subtracts. A
third of them carry a sentence whose number does not matter; a fifth of those of two steps or more tell both in one
sentence (amounts listed and summed, or a product taken from a count). The held-out kinds are written apart from
them, in other sentence shapes and other worlds (prices and change, points and comparisons, teams, days): ``price``
(a unit price times a count), ``compare`` (how many more), ``groups`` (so many groups of so many), ``share`` (a total
shared equally), ``sum_three`` (three amounts in one sentence), ``change`` (paying with a bill for several things at
one price). So a gain there is transfer, not recall, and a kind that falls says what training took away
(docs/results.md). With ``compare`` the training set also holds, after every eleventh story, two people's counts
compared ("How many more ... than ...?"), marked ``warm_start: False``: GRPO samples them, the warm start skips them.
"""

from __future__ import annotations

import random

from .held_out import distinct


NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Iris", "Jack", "Kira", "Luis", "Maya", "Noah"]
ITEMS = ["apples", "pencils", "marbles", "cookies", "stickers", "books", "shells", "cards", "eggs", "bottles"]
PACKS = ["boxes", "bags", "packs", "jars", "baskets", "crates"]

# The first sentence: a starting count (one per problem).
START = [
    "{name} has {a} {item}.",
    "{name} had {a} {item} in the morning.",
    "There are {a} {item} in {name}'s room.",
    "{name} started the week with {a} {item}.",
]
# One step each, in several phrasings; ``{n}`` is the step's number. Multiplication and sharing act on the count.
STEPS = {
    "+": [
        "{name} gets {n} more.",
        "Then {name} finds {n} more {item}.",
        "A friend gives {name} {n} more.",
        "{name} buys {n} more {item}.",
    ],
    "-": [
        "{name} gives away {n}.",
        "Then {name} loses {n} of them.",
        "{name} uses {n} of the {item}.",
        "{name} gives {n} {item} to a friend.",
    ],
    "*": [
        "Now {name} has {n} times as many {item} as before.",
        "Then the number of {item} becomes {n} times larger.",
        "By evening {name} has {n} times as many {item}.",
    ],
    "/": [
        "{name} shares them equally among {n} friends, keeping none.",
        "{name} puts them equally into {n} {pack}.",
        "{name} divides them into {n} equal piles.",
    ],
}
QUESTION = {  # what is asked, by the last operation
    "+": ["How many {item} does {name} have now?", "How many {item} are there now?"],
    "-": ["How many {item} are left?", "How many {item} does {name} have now?"],
    "*": ["How many {item} does {name} have now?", "How many {item} are there in all?"],
    "/": ["How many {item} are in each one?", "How many {item} does each get?"],
}
# The last step told in the question instead (a third of the problems): its number comes after every other.
ASKED = {
    "+": ["How many {item} does {name} have after getting {n} more?", "If {name} finds {n} more, how many are there?"],
    "-": ["How many {item} are left after {name} gives away {n}?", "If {name} loses {n}, how many {item} are left?"],
    "*": ["How many {item} are there if that number becomes {n} times larger?"],
    "/": ["If {name} splits them into {n} equal piles, how many {item} are in each?"],
}
# A first step of its own shape: a multiplication told as packs (the count starts as their product). No phrase decides
# the operation: three of the six use the words of sharing ("splits", "shares", "puts into"), and "into N packs of M"
# is a product here while "into packs of M" after a total is a quotient (``FILLS``). What is given and what is asked
# does: a count of parts and the size of each make a product, a total and the size of each part a quotient.
# ``None``: the story's own packs.
PACKED = {
    "{name} buys {a} {pack} with {b} {item} in each.": None,
    "{name} has {a} {pack}, each holding {b} {item}.": None,
    "{name} splits the {item} into {a} equal piles, with {b} in each pile.": "piles",
    "{name} shares the {item} among {a} friends, and each friend gets {b}.": "friends",
    "{name} puts the {item} into {a} {pack}, {b} in each.": None,
    "{name} sorts the {item} into {a} {pack} of {b}.": None,
}
# A one-step story of packs told the other way round (half of them): the size of each first, their count asked.
EACH = ("Each {one} holds {b} {item}.", "How many {item} are in {a} {pack}?")
# A last sharing step that asks for the number of packs (a third of them): the total divided by the size of each.
FILLS = (["{name} packs them into {pack} of {n}.", "{name} puts them into {pack}, {n} in each."],
         "How many {pack} does {name} fill?")  # fmt: skip
# A last step that asks how many more reach a goal (a quarter of the stories with room for a step): the goal minus
# the count. Without it "more" always added, and GRPO took 'compare' ("How many more did Rosa score?") to 0 by adding
# (docs/results.md).
GOAL = (["{name} wants {goal} {item}.", "{name} needs {goal} {item} for a party.", "{name} hopes to have {goal}."],
        ["How many more {item} does {name} need?", "How many more does {name} need?"])  # fmt: skip
ONE = {"boxes": "box", "bags": "bag", "packs": "pack", "jars": "jar", "baskets": "basket", "crates": "crate"}
DISTRACTORS = ["{name} is {x} years old.", "{other} has {x} {other_item}.", "It is {x} degrees outside.",
               "{name}'s house is number {x}."]  # fmt: skip

# Two people's counts compared (``make_train(compare=True)``): the larger minus the smaller. In the stories "how many
# more" only reaches a goal; these ask it between two counts, in items, not in the held-out kind's points and laps.
COMPARED = [
    "{a} has {x} {item} and {b} has {y}. How many more {item} does {a} have than {b}?",
    "{a} collected {x} {item} and {b} collected {y}. How many more did {a} collect than {b}?",
]
COMPARE_EVERY = 11  # a comparison after every eleventh story: one training row in twelve

HELD_OUT_KINDS = ("price", "compare", "groups", "share", "sum_three", "change")
HELD_OUT_NAMES = ["Olga", "Pedro", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wes", "Yara"]


def _apply(total: int, op: str, n: int) -> int:
    return {"+": total + n, "-": total - n, "*": total * n, "/": total // n}[op]


def _step_number(rng: random.Random, total: int, op: str) -> int | None:
    """A number for ``op`` on ``total`` that keeps every count a positive whole number below 200, or None."""
    if op == "+":
        return rng.randint(2, 15)
    if op == "-":
        return rng.randint(1, total - 1) if total > 1 else None
    if op == "*":
        return rng.randint(2, 5) if total <= 40 else None
    divisors = [d for d in range(2, 10) if total % d == 0 and total // d >= 1]
    return rng.choice(divisors) if divisors else None


# What a worked line counts, named before its equation (``named_lines``): "4 bags of 6 marbles: 4 * 6 = 24".
NAMED = {
    "+": "{n} more: ",
    "-": "{n} fewer: ",
    "*": "{n} times as many: ",
    "/": "{total} {item} in {n} equal parts: ",
}
NAMED_PACKS = "{a} {pack} of {b} {item}: "  # the first line of a story that starts with packs: a * b
NAMED_FILLS = "{total} {item} in {pack} of {n}: "  # a last step that asks how many packs: total / n
NAMED_GOAL = "{goal} {item} wanted: "  # a last step that asks how many more to a goal: goal - total

# Two operations in one sentence (a fifth of the problems of two steps or more): amounts listed one after another,
# summed; or a product taken from a count. The chained held-out kinds need these structures (``sum_three``,
# ``change``); they stay written apart, in other worlds and words.
LISTED = [
    "{name} picks {a} {item} in the morning, {b} in the afternoon and {c} in the evening.",
    "{name} finds {a} {item} in the garden, {b} in the shed and {c} in the attic.",
]
TAKEN = [
    "{name} has {a} {item} and gives {n} friends {m} {item} each.",
    "{name} has {a} {item} and puts {m} of them into each of {n} {pack}.",
]
TAKEN_QUESTION = {0: "How many {item} does {name} have left?", 1: "How many {item} are not in the {pack}?"}
NAMED_TAKEN = "{n} {group} with {m} each: "  # the product's line of a TAKEN problem


def _in_one_sentence(rng: random.Random, name: str, item: str, pack: str, named_lines: bool) -> dict:
    """A problem whose two operations are told in one sentence (``LISTED``: a + b + c; ``TAKEN``: a - n * m)."""
    if rng.random() < 0.5:
        a, b, c = (rng.randint(2, 20) for _ in range(3))
        sentence = rng.choice(LISTED).format(name=name, item=item, a=a, b=b, c=c)
        question = f"How many {item} does {name} have now?"
        named = [NAMED["+"].format(n=b), NAMED["+"].format(n=c)] if named_lines else ["", ""]
        lines, total = [f"{named[0]}{a} + {b} = {a + b}", f"{named[1]}{a + b} + {c} = {a + b + c}"], a + b + c
    else:
        shape, n, m = rng.randrange(len(TAKEN)), rng.randint(2, 6), rng.randint(2, 6)
        a = rng.randint(n * m + 1, n * m + 30)
        sentence = TAKEN[shape].format(name=name, item=item, pack=pack, a=a, n=n, m=m)
        question = TAKEN_QUESTION[shape].format(name=name, item=item, pack=pack)
        group = "friends" if shape == 0 else pack
        named = [NAMED_TAKEN.format(n=n, m=m, group=group), NAMED["-"].format(n=n * m)] if named_lines else ["", ""]
        lines, total = [f"{named[0]}{n} * {m} = {n * m}", f"{named[1]}{a} - {n * m} = {a - n * m}"], a - n * m
    return {
        "question": f"{sentence} {question}",
        "answer": "\n".join([*lines, f"#### {total}"]),
        "solution": str(total),
    }


def make_problem(rng: random.Random, max_steps: int = 3, named_lines: bool = False) -> dict:
    """One training problem: ``question``, ``answer`` (a worked line per operation, then ``#### N``), ``solution``;
    at most ``max_steps`` operations. ``named_lines``: each line names what it counts first (``NAMED``); the same
    draws from ``rng`` either way, so the problems are the same."""
    while True:
        name, item, pack = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(PACKS)
        if max_steps >= 2 and rng.random() < 0.2:
            return _in_one_sentence(rng, name, item, pack, named_lines)
        steps = rng.choice([n for n in (1, 1, 2, 2, 3) if n <= max_steps])
        packed = rng.random() < 0.25  # packs first: a multiplication of two numbers of the story, one of the steps
        ops = [rng.choice("+-*/") for _ in range(steps - packed)]
        if packed:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            shape = rng.choice(list(PACKED))
            sentences, lines, total = [shape.format(name=name, a=a, b=b, item=item, pack=pack)], [], a * b
            group = PACKED[shape]  # the line names the story's packs, or the piles or friends of the sentence
            named = (
                NAMED_TAKEN.format(n=a, m=b, group=group)
                if group
                else NAMED_PACKS.format(a=a, b=b, pack=pack, item=item)
            )
            lines.append(f"{named if named_lines else ''}{a} * {b} = {total}")
        else:
            total = rng.randint(3, 30)
            sentences, lines = [rng.choice(START).format(name=name, a=total, item=item)], []
        ok = True
        for op in ops:
            n = _step_number(rng, total, op)
            if n is None:
                ok = False
                break
            sentences.append(rng.choice(STEPS[op]).format(name=name, n=n, item=item, pack=pack))
            result = _apply(total, op, n)
            named = NAMED[op].format(n=n, total=total, item=item) if named_lines else ""
            lines.append(f"{named}{total} {op} {n} = {result}")
            before, total = total, result
        if not ok or total < 1 or total >= 200:
            continue
        last = ops[-1] if ops else "*"
        question = rng.choice(QUESTION[last]).format(name=name, item=item)
        if len(lines) < max_steps and total <= 180 and rng.random() < 0.25:  # how many more to a goal
            goal = total + rng.randint(2, 19)
            sentences.append(rng.choice(GOAL[0]).format(name=name, goal=goal, item=item))
            question = rng.choice(GOAL[1]).format(name=name, item=item)
            named = NAMED_GOAL.format(goal=goal, item=item) if named_lines else ""
            lines.append(f"{named}{goal} - {total} = {goal - total}")
            total = goal - total
        elif packed and not ops and rng.random() < 0.5:  # the size of each first, the count of packs asked
            sentences = [EACH[0].format(one=ONE[pack], b=b, item=item)]
            question = EACH[1].format(item=item, a=a, pack=pack)
            named = NAMED_PACKS.format(a=a, b=b, pack=pack, item=item) if named_lines else ""
            lines = [f"{named}{a} * {b} = {total}"]
        elif last == "/" and rng.random() < 1 / 3:  # how many packs: the total over the size of each
            sentences[-1] = rng.choice(FILLS[0]).format(name=name, pack=pack, n=n)
            question = FILLS[1].format(pack=pack, name=name)
            named = NAMED_FILLS.format(total=before, item=item, pack=pack, n=n) if named_lines else ""
            lines[-1] = f"{named}{before} / {n} = {total}"
        elif ops and rng.random() < 1 / 3:  # the last step asked in the question
            sentences.pop()
            question = rng.choice(ASKED[last]).format(name=name, item=item, n=n)  # n: the last step's number
        if rng.random() < 1 / 3:  # a number that does not matter, anywhere but first
            other = rng.choice([n for n in NAMES if n != name])
            distractor = rng.choice(DISTRACTORS).format(
                name=name, other=other, x=rng.randint(2, 40), other_item=rng.choice([i for i in ITEMS if i != item])
            )
            sentences.insert(rng.randint(1, len(sentences)), distractor)
        sentences.append(question)
        return {
            "question": " ".join(sentences),
            "answer": "\n".join([*lines, f"#### {total}"]),
            "solution": str(total),
        }


def make_comparison(rng: random.Random, named_lines: bool = False) -> dict:
    """Two people's counts and how many more the first has (``COMPARED``): one worked line, then ``#### N``."""
    first, second = rng.sample(NAMES, 2)
    item, low, more = rng.choice(ITEMS), rng.randint(3, 30), rng.randint(2, 20)
    question = rng.choice(COMPARED).format(a=first, b=second, item=item, x=low + more, y=low)
    named = f"{low + more} {item} against {low}: " if named_lines else ""
    return {
        "question": question,
        "answer": f"{named}{low + more} - {low} = {more}\n#### {more}",
        "solution": str(more),
    }


def make_train(n: int, seed: int, max_steps: int = 3, named_lines: bool = False, compare: bool = False) -> list[dict]:
    """``n`` training stories of at most ``max_steps`` operations, reproducible from ``seed`` (``named_lines``: see
    ``make_problem``). ``compare``: a comparison (``make_comparison``, its own draws, so the stories stay the same)
    after every ``COMPARE_EVERY``-th story, and a ``warm_start`` column, False on the comparisons: the warm start
    skips them (``hf_grpo.training.warm_start.GoldPairs``) and only GRPO samples them."""
    if not 1 <= max_steps <= 3:
        raise ValueError(f"word_problems_max_steps must be 1, 2 or 3, got {max_steps!r}; set it in the recipe")
    rng = random.Random(f"word-problems-train-{seed}")
    stories = [make_problem(rng, max_steps, named_lines) for _ in range(n)]
    if not compare:
        return stories
    compared = random.Random(f"word-problems-compare-{seed}")
    rows = []
    for i, story in enumerate(stories, 1):
        rows.append({**story, "warm_start": True})
        if i % COMPARE_EVERY == 0:
            rows.append({**make_comparison(compared, named_lines), "warm_start": False})
    return rows


def _held_out(rng: random.Random, kind: str) -> dict:
    """One held-out problem of ``kind`` (``HELD_OUT_KINDS``), its worked answer and solution. Each kind has room for
    88 or more sets of numbers (``HELD_OUT_SPACE``), so a set of 300 (50 a kind) has no repeat."""
    name, other = rng.sample(HELD_OUT_NAMES, 2)
    if kind == "price":
        price, count = rng.randint(2, 12), rng.randint(2, 9)
        thing = rng.choice(["notebook", "ticket", "sandwich", "poster"])
        question = f"A {thing} costs {price} dollars. How many dollars do {count} {thing}s cost?"
        lines, result = [f"{count} * {price} = {count * price}"], count * price
    elif kind == "compare":
        low, more = rng.randint(3, 20), rng.randint(2, 15)
        what = rng.choice(["points in the game", "laps around the track", "goals this season"])
        question = f"{name} scored {low + more} {what} and {other} scored {low}. How many more did {name} score?"
        lines, result = [f"{low + more} - {low} = {more}"], more
    elif kind == "groups":
        groups, size = rng.randint(2, 9), rng.randint(2, 12)
        question = (
            f"The coach splits the club into {groups} teams of {size} players. How many players are in the club?"
        )
        lines, result = [f"{groups} * {size} = {groups * size}"], groups * size
    elif kind == "share":
        people, each = rng.randint(2, 9), rng.randint(2, 12)
        food = rng.choice(["grapes", "crackers", "slices of melon"])
        question = f"{people * each} {food} are served equally on {people} plates. How many are on each plate?"
        lines, result = [f"{people * each} / {people} = {each}"], each
    elif kind == "sum_three":
        x, y, z = (rng.randint(2, 20) for _ in range(3))
        question = f"A bakery sold {x} pies on Friday, {y} on Saturday and {z} on Sunday. How many pies did it sell?"
        lines, result = [f"{x} + {y} = {x + y}", f"{x + y} + {z} = {x + y + z}"], x + y + z
    else:  # change
        price, count = rng.randint(2, 9), rng.randint(2, 5)
        bill = rng.choice([b for b in CHANGE_BILLS if b > price * count])
        question = (
            f"{name} pays with a {bill} dollar bill for {count} pens at {price} dollars each. How many dollars of "
            f"change does {name} get?"
        )
        cost = price * count
        lines, result = [f"{count} * {price} = {cost}", f"{bill} - {cost} = {bill - cost}"], bill - cost
    return {"question": question, "answer": "\n".join([*lines, f"#### {result}"]), "solution": str(result)}


CHANGE_BILLS = (10, 20, 50, 100)
# Distinct sets of numbers of each held-out kind: a set asks for at most this many of a kind.
HELD_OUT_SPACE = {"price": 11 * 8, "compare": 18 * 14, "groups": 8 * 11, "share": 8 * 11, "sum_three": 19**3,
                  "change": sum(b > p * c for p in range(2, 10) for c in range(2, 6) for b in CHANGE_BILLS)}  # fmt: skip


def make_held_out(n: int, seed: int) -> list[dict]:
    """``n`` held-out problems, their ``kind`` cycling through ``HELD_OUT_KINDS``, no two alike (no same question,
    within a kind no same numbers: ``held_out.distinct``). Reproducible from ``seed``."""
    kinds = [HELD_OUT_KINDS[i % len(HELD_OUT_KINDS)] for i in range(n)]
    short = [k for k in HELD_OUT_KINDS if kinds.count(k) > HELD_OUT_SPACE[k]]
    if short:
        most = len(HELD_OUT_KINDS) * min(HELD_OUT_SPACE.values())
        raise ValueError(
            f"word_problems_held_out has {HELD_OUT_SPACE[short[0]]} distinct {short[0]!r} problems and "
            f"arithmetic_eval_size {n} asks for {kinds.count(short[0])}: set arithmetic_eval_size to at most {most}"
        )
    rng = random.Random(f"word-problems-held-out-{seed}")
    return distinct(lambda kind: _held_out(rng, kind), kinds, "word_problems_held_out")
