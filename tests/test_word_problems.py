"""The embedded word problems (``hf_grpo.data.word_problems``): every worked line is right arithmetic, the step count
obeys ``word_problems_max_steps``, and the held-out kinds share no names and no question shapes with training."""

from __future__ import annotations

import doctest
import re

import pytest

from hf_grpo.data import word_problems
from hf_grpo.data.word_problems import HELD_OUT_KINDS, HELD_OUT_NAMES, ITEMS, PACKS, make_held_out, make_train


LINE = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")


def check_worked(answer: str, solution: str, chained: bool = True, named: bool = False) -> int:
    """The number of worked lines of ``answer``, each checked (and, ``chained``, each feeding the next); the last
    line is ``#### N``."""
    *lines, last = answer.splitlines()
    assert last == f"#### {solution}"
    previous = None
    for line in lines:
        a, op, b, result = LINE.match(line.split(": ")[1] if named else line).groups()  # named: "label: a op b = c"
        a, b, result = int(a), int(b), int(result)
        assert result == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] and (op != "/" or a % b == 0), line
        assert not chained or previous is None or previous in (a, b), line  # b: a product taken from a count
        previous = result
    assert str(previous) == solution
    return len(lines)


@pytest.mark.parametrize("max_steps", [1, 2, 3])
def test_training_problems_are_right_and_no_longer_than_asked(max_steps):
    problems = make_train(400, seed=3, max_steps=max_steps)
    steps = [check_worked(p["answer"], p["solution"]) for p in problems]
    assert max(steps) == max_steps and min(steps) == 1
    ops = {line.split()[1] for p in problems for line in p["answer"].splitlines()[:-1]}
    assert ops == set("+-*/")  # all four operations at every setting
    assert not any(name in p["question"] for p in problems for name in HELD_OUT_NAMES)


def test_named_lines_name_what_they_count_on_the_same_problems():
    plain, named = make_train(300, seed=5, max_steps=2), make_train(300, seed=5, max_steps=2, named_lines=True)
    assert [p["question"] for p in plain] == [p["question"] for p in named]
    for p, q in zip(plain, named, strict=True):
        assert check_worked(q["answer"], q["solution"], named=True) == check_worked(p["answer"], p["solution"])
        for bare, line in zip(p["answer"].splitlines()[:-1], q["answer"].splitlines()[:-1], strict=True):
            label, equation = line.split(": ")
            assert equation == bare
            a, op, b = bare.split()[:3]
            labels = {
                "+": {f"{b} more"},
                "-": {f"{b} fewer"} | {f"{a} {item} wanted" for item in ITEMS},
                "*": {f"{b} times as many"}
                | {f"{a} {pack} of {b} {item}" for pack in PACKS for item in ITEMS}
                | {f"{a} {group} with {b} each" for group in ("friends", "piles", *PACKS)},
                "/": {f"{a} {item} in {b} equal parts" for item in ITEMS}
                | {f"{a} {item} in {pack} of {b}" for pack in PACKS for item in ITEMS},
            }
            assert label in labels[op], line


def test_a_fifth_of_two_step_problems_tell_both_steps_in_one_sentence():
    """Amounts listed and summed, or a product taken from a count: the structures of the chained held-out kinds
    (``sum_three``, ``change``), told in the training stories' world."""
    problems = make_train(1000, seed=1, max_steps=2)
    listed = [p for p in problems if " in the morning, " in p["question"] or " in the garden, " in p["question"]]
    taken = [p for p in problems if " and gives " in p["question"] or " and puts " in p["question"]]
    assert 60 < len(listed) < 140 and 60 < len(taken) < 140, (len(listed), len(taken))
    assert all(p["answer"].count("+") == 2 for p in listed) and all(" * " in p["answer"] for p in taken)
    assert not make_train(200, seed=1, max_steps=1)[0]["answer"].count("\n") > 1  # one step: none of them


@pytest.mark.parametrize("max_steps", [1, 2, 3])
def test_no_verb_decides_the_operation(max_steps):
    """A verb of sharing starts products too, and packing asks quotients too: what is given and what is asked
    decides (the warm start read "splits ... into N" as a division, always one in training until 2026-12-06)."""
    problems = make_train(600, seed=2, max_steps=max_steps)
    for verb in (" splits ", " shares ", " puts "):
        told = [p for p in problems if verb in p["question"]]
        firsts = {p["answer"].splitlines()[0].split()[1] for p in told}  # the first worked line's operation
        lasts = {p["answer"].splitlines()[-2].split()[1] for p in told}
        assert "*" in firsts | lasts and "/" in firsts | lasts, (verb, firsts, lasts)
    each = [p for p in problems if p["question"].startswith("Each ")]  # the size first, the count of packs asked
    assert each and all(p["answer"].count("\n") == 1 and " * " in p["answer"] for p in each)


@pytest.mark.parametrize("max_steps", [2, 3])
def test_a_cue_word_leans_to_neither_reading(max_steps):
    """ "splits" starts as many products as quotients, "into N packs of M" is a product where "into packs of M" after a
    total is a quotient, and "how many more" to a goal subtracts. Until 2026-12-06 "splits" led to 1.3-1.8 quotients
    a product, "into ... of M" always divided, and "more" always added: GRPO wrote '7 / 2 = 3' for "splits the club
    into 7 teams of 2" and took 'compare' to 0 by adding."""
    problems = make_train(2000, seed=2, max_steps=max_steps)
    splits = [p["answer"] for p in problems if " splits " in p["question"]]
    products, quotients = sum(" * " in a for a in splits), sum(" / " in a for a in splits)
    assert 0.8 < products / quotients < 1.25, (products, quotients)
    into = [p for p in problems if re.search(r"into \d+ \w+ of \d+", p["question"])]
    assert into and all(" * " in p["answer"].splitlines()[0] for p in into)
    goals = [p["answer"].splitlines()[-2] for p in problems if "How many more" in p["question"]]
    assert len(goals) > len(problems) // 20 and all(" - " in line for line in goals), goals[:5]


def test_a_step_count_out_of_range_names_the_key():
    with pytest.raises(ValueError, match="word_problems_max_steps"):
        make_train(4, seed=0, max_steps=4)


def test_held_out_kinds_are_right_and_written_apart():
    problems = make_held_out(120, seed=0)
    assert [p["kind"] for p in problems[: len(HELD_OUT_KINDS)]] == list(HELD_OUT_KINDS)
    for p in problems:
        check_worked(p["answer"], p["solution"], chained=False)  # change: the bill minus the cost
    train_openings = {p["question"].split()[1] for p in make_train(400, seed=0, compare=True)}
    held_out_openings = {p["question"].split()[1] for p in problems}
    assert not train_openings & held_out_openings  # "A ticket costs", "Olga scored": no training opening


@pytest.mark.parametrize("named_lines", [False, True])
def test_comparisons_for_grpo_only_leave_the_stories_draw_for_draw(named_lines):
    """``word_problems_compare``: after every eleventh story a comparison of two counts, marked for GRPO only; the
    stories (what the warm start draws from) stay the same."""
    stories = make_train(110, seed=4, max_steps=2, named_lines=named_lines)
    rows = make_train(110, seed=4, max_steps=2, named_lines=named_lines, compare=True)
    assert [{k: v for k, v in r.items() if k != "warm_start"} for r in rows if r["warm_start"]] == stories
    assert [i for i, r in enumerate(rows) if not r["warm_start"]] == list(range(11, len(rows), 12))  # 10 of 120
    for row in rows[11::12]:
        assert check_worked(row["answer"], row["solution"], named=named_lines) == 1
        first, _, more, _, smaller, *_ = re.split(r" (has|collected) ", row["question"].split(". ")[0])
        assert re.search(rf"How many more .*{first}.* than ", row["question"]), row["question"]  # the larger asked
        assert " - " in row["answer"] and int(row["solution"]) == int(more.split()[0]) - int(smaller.rstrip("."))
        assert not any(name in row["question"] for name in HELD_OUT_NAMES)


def test_doctests():
    from hf_grpo.data import embedded

    assert doctest.testmod(word_problems).failed == 0 and doctest.testmod(embedded).failed == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_embedded_held_out_set_has_no_repeats(seed):
    """A repeat is graded the same way twice: word_problems_held_out held 30-36 exact repeats in 300 and 13-14
    distinct 'change' problems in 50; the arithmetic sets repeated questions too."""
    from hf_grpo.data.arithmetic import make_reasoning_split, make_split, make_transfer_split
    from hf_grpo.data.held_out import same_problem

    sets = {
        "word_problems_held_out": make_held_out(300, seed),
        "arithmetic_transfer": make_transfer_split(300, seed),
        "arithmetic_reasoning": make_reasoning_split(300, seed),
        "arithmetic test": make_split("test", 500, seed),
    }
    for name, problems in sets.items():
        assert len({p["question"] for p in problems}) == len(problems), name
        kinds = [(p["kind"], same_problem(p)) for p in problems if "kind" in p]
        assert len(set(kinds)) == len(kinds), name  # within a kind: no two with the same worked solution


def test_each_held_out_kind_has_room_for_its_share_and_a_larger_set_names_the_key():
    for kind, space in word_problems.HELD_OUT_SPACE.items():
        assert space >= 88, kind  # 300 problems ask for 50 of each
    most = 6 * min(word_problems.HELD_OUT_SPACE.values())
    assert len(make_held_out(most, 0)) == most
    with pytest.raises(ValueError, match=f"set arithmetic_eval_size to at most {most}"):
        make_held_out(most + 6, 0)


def test_a_held_out_file_with_repeated_prompts_is_evaluated_once_per_problem(tmp_path, caplog):
    import json
    import logging

    from hf_grpo.data.loaders import DataArguments, load_grpo_datasets

    rows = [{"question": f"What is {a} + 1?", "answer": f"#### {a + 1}"} for a in (1, 2, 2, 3, 1)]
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = DataArguments(dataset_name=str(path), eval_dataset_name=str(path), prompt_column="question",
                         solution_column="answer", task="gsm8k")  # fmt: skip
    with caplog.at_level(logging.WARNING):
        _, held_out = load_grpo_datasets(args)
    assert len(held_out) == 3 and "dropped 2 of 5 rows whose prompt repeats an earlier row's" in caplog.text
