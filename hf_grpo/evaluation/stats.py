"""Is a before/after held-out difference real? The paired gain with its 95% interval, from the per-problem grades.

The same held-out problems are graded before and after training, so the comparison is paired: per problem the
difference d_i = after_i - before_i is -1 (right -> wrong), 0 (unchanged) or +1 (wrong -> right), and the gain in
accuracy is their mean. Its uncertainty comes only from the problems that changed, so a +3.5 point gain on 200
problems can be noise (16 right -> wrong against 23 wrong -> right) or not (1 against 8), which the two accuracies
alone cannot tell. ``paired_gain`` takes the two grade lists; ``gain_from_run`` reads them from a run's
``eval_before.jsonl`` and ``eval_after.jsonl`` (written by ``hf_grpo.evaluation.tasks.TaskEvaluator.run``);
``resolve_gain`` picks the gain a run's report shows (``usable_gain``: it must agree with the before/after summaries).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import NormalDist

from ..base.run_files import EVAL_FILE, EVAL_RECORDS


logger = logging.getLogger(__name__)

CORRECT = "correct"  # the grade that counts as right; "wrong" and "unparseable" both count as not right
# Every grade an evaluation record can hold: the grader's three (rewards.grading.GRADES), then a grading that timed
# out or failed in its worker (evaluation.core).
EVAL_GRADES = ("correct", "wrong", "unparseable", "timeout", "error")
METHOD = "Bonett-Price adjusted Wald, paired per problem"
Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054


def _as_grades(grades: Sequence[str], name: str) -> list[str]:
    if isinstance(grades, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of grades (one per problem), not a single string: {grades!r}")
    grades = list(grades)
    for i, grade in enumerate(grades):
        if not isinstance(grade, str):
            raise TypeError(f"{name}[{i}] is {grade!r}; grades are strings such as 'correct', 'wrong', 'unparseable'")
    return grades


def paired_gain(before: Sequence[str], after: Sequence[str]) -> dict:
    """The accuracy gain from ``before`` to ``after`` on the same problems, with its paired 95% interval.

    ``before[i]`` and ``after[i]`` are the grades of problem ``i`` (a problem is right when its grade is
    ``"correct"``). Returns ``n``, ``before_accuracy``, ``after_accuracy``, ``gain`` (= after - before = the mean of
    d_i = after_i - before_i), ``ci95`` (``[low, high]``, for the mean of d_i), ``right_to_wrong`` and
    ``wrong_to_right`` (the problems with d_i = -1 and +1) and ``method``.

    The interval is the adjusted Wald interval of Bonett & Price (2012, J. Educ. Behav. Stat. 37:479) for a
    difference of paired proportions: with b = right_to_wrong and c = wrong_to_right, add one pseudo-problem to each
    of b and c (p_b = (b + 1) / (n + 2), p_c = (c + 1) / (n + 2)) and take
    p_c - p_b +- 1.96 * sqrt((p_b + p_c - (p_c - p_b) ** 2) / (n + 2)), truncated to [-1, 1]. Why this one: the
    plain Wald interval (mean of d_i +- 1.96 standard errors) has width zero whenever no problem changed or all
    changed the same way (all d_i equal), at any n, and undercovers at small n; the pseudo-counts keep the interval
    open there (n = 10 with no change gives +-0.23) and pull it back from the bounds, and Fagerland, Lydersen & Laake
    (2014, Stat. Med. 33:2850) recommend it among closed-form intervals for paired proportions for coverage close to
    95% at small n. Newcombe's square-and-add interval, the other closed form, collapses to width zero when no
    problem changed and the accuracy is 50%. The interval is centred on the shrunk (c - b) / (n + 2), so it is not
    symmetric about ``gain``, which it contains.

    The published example (Cavo et al. 2012 in Fagerland et al. 2014: 161 pairs, 6 right -> wrong, 16 wrong -> right;
    reference interval 0.0032 to 0.1195):

    >>> before = ["correct"] * 65 + ["wrong"] * 96
    >>> after = ["correct"] * 59 + ["wrong"] * 6 + ["correct"] * 16 + ["wrong"] * 80
    >>> g = paired_gain(before, after)
    >>> g["n"], g["right_to_wrong"], g["wrong_to_right"], round(g["gain"], 4), [round(x, 4) for x in g["ci95"]]
    (161, 6, 16, 0.0621, [0.0032, 0.1195])
    >>> [round(x, 4) for x in paired_gain(["correct"] * 5 + ["wrong"] * 5, ["correct"] * 5 + ["wrong"] * 5)["ci95"]]
    [-0.231, 0.231]
    """
    before, after = _as_grades(before, "before"), _as_grades(after, "after")
    if len(before) != len(after):
        raise ValueError(
            f"before and after must grade the same problems in the same order, but before has {len(before)} grades "
            f"and after has {len(after)}"
        )
    n = len(before)
    if n == 0:
        raise ValueError("no problems: paired_gain needs at least one (before, after) pair of grades")
    right_before = [g == CORRECT for g in before]
    right_after = [g == CORRECT for g in after]
    b = sum(rb and not ra for rb, ra in zip(right_before, right_after, strict=True))  # right -> wrong
    c = sum(ra and not rb for rb, ra in zip(right_before, right_after, strict=True))  # wrong -> right
    p_b, p_c = (b + 1) / (n + 2), (c + 1) / (n + 2)
    centre = p_c - p_b
    half = Z95 * math.sqrt((p_b + p_c - centre**2) / (n + 2))
    return {
        "n": n,
        "before_accuracy": sum(right_before) / n,
        "after_accuracy": sum(right_after) / n,
        "gain": (c - b) / n,
        "ci95": [max(-1.0, centre - half), min(1.0, centre + half)],
        "right_to_wrong": b,
        "wrong_to_right": c,
        "method": METHOD,
    }


def summarize(records: list[dict]) -> dict:
    """An evaluation's summary from its per-problem records: accuracy, a count per grade, total."""
    n = len(records)
    counts = {g: sum(r["grade"] == g for r in records) for g in EVAL_GRADES}
    return {"accuracy": counts["correct"] / n if n else 0.0, **counts, "total": n}


def one_sided_p(gain: dict, direction: str) -> float:
    """McNemar's exact one-sided p-value of a ``paired_gain``: the chance, were accuracy unchanged, that at least as
    many of the problems that changed would have moved ``direction`` (``"fell"``: right -> wrong, ``"rose"``).

    Conditional on the m problems that changed, each moved either way with chance 1/2 under no change, so the count
    that fell is Binomial(m, 1/2) (McNemar 1947). Exact, so its error rate holds at any level and any m, where the
    adjusted Wald interval is anti-conservative in the far tail (12 of 12 fell: 6.7e-5 against the exact 2.4e-4).

    >>> one_sided_p({"right_to_wrong": 9, "wrong_to_right": 1}, "fell")  # 11 of the 1024 ways
    0.0107421875
    """
    moved, other = gain["right_to_wrong"], gain["wrong_to_right"]
    if direction == "rose":
        moved, other = other, moved
    m = moved + other
    return sum(math.comb(m, k) for k in range(moved, m + 1)) / 2**m


def gains_by_kind(before: list[dict], after: list[dict]) -> dict[str, dict]:
    """``paired_gain`` per kind of held-out problem (the records' ``kind``, matched by ``index``); empty when the
    held-out set names no kinds."""
    after_by_index = {r["index"]: r for r in after}
    kinds: dict[str, list[tuple[str, str]]] = {}
    for record in before:
        other = after_by_index.get(record["index"])
        if "kind" in record and other is not None:
            kinds.setdefault(str(record["kind"]), []).append((record["grade"], other["grade"]))
    return {kind: paired_gain(*zip(*pairs, strict=True)) for kind, pairs in sorted(kinds.items())}


def _read_grades(path: Path) -> dict[int, str]:
    """index -> grade of one ``eval_<label>.jsonl``; ValueError naming the file and line for anything malformed."""
    grades: dict[int, str] = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno} is not valid JSON ({exc})") from None
            if not isinstance(record, dict) or "index" not in record or "grade" not in record:
                raise ValueError(f"{path}:{lineno} has no 'index' and 'grade' fields")
            index = record["index"]
            if type(index) is not int:  # bool is no index either
                raise ValueError(f"{path}:{lineno}: index {index!r} is not an integer")
            if index in grades:
                raise ValueError(f"{path}:{lineno}: problem index {index} appears twice")
            grades[index] = record["grade"]
    return grades


def _few(indices: set[int]) -> str:
    shown = sorted(indices)[:5]
    return ", ".join(map(str, shown)) + (", ..." if len(indices) > len(shown) else "")


def gain_from_run(output_dir: str | Path) -> dict | None:
    """``paired_gain`` of the run in ``output_dir``, from its ``eval_before.jsonl`` and ``eval_after.jsonl``.

    Problems are matched by their ``index`` field, so the line order does not matter. Returns None when either file
    is missing (a run without the before/after evaluation). Raises ValueError when the two files do not hold the
    same problems (or a line is malformed, or they are empty): a gain over different problems would not be paired.
    """
    out = Path(output_dir)
    paths = [out / EVAL_RECORDS.format(label=label) for label in ("before", "after")]
    if not all(p.is_file() for p in paths):
        return None
    before, after = (_read_grades(p) for p in paths)
    if before.keys() != after.keys():
        only = [before.keys() - after.keys(), after.keys() - before.keys()]
        parts = [f"{len(o)} only in {p.name} (index {_few(o)})" for o, p in zip(only, paths, strict=True) if o]
        raise ValueError(
            f"{out}: the before and after evaluations graded different problems: {'; '.join(parts)}; "
            "a paired gain needs the same held-out problems in both"
        )
    if not before:
        raise ValueError(f"{out}: {paths[0].name} and {paths[1].name} hold no graded problems")
    order = sorted(before)
    return paired_gain([before[i] for i in order], [after[i] for i in order])


def points(x: float) -> str:
    """A difference in accuracy as signed points: 0.035 -> ``+3.5``."""
    return f"{x * 100:+.1f}"


def usable_gain(gain, results: dict | None) -> dict | None:
    """``gain`` when it is a paired_gain dict that agrees with the before/after summaries of ``results``, else None.

    A gain computed from jsonl files of another evaluation (other problems, other grades) would put numbers next to
    the table that do not belong to it; leaving them out is better than showing them.
    """
    if not isinstance(gain, dict):
        return None
    try:
        n, low, high = int(gain["n"]), float(gain["ci95"][0]), float(gain["ci95"][1])
        values = [float(gain[k]) for k in ("gain", "before_accuracy", "after_accuracy")]
        int(gain["right_to_wrong"]), int(gain["wrong_to_right"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if n <= 0 or not all(math.isfinite(v) for v in (low, high, *values)):
        return None
    for phase in ("before", "after"):
        summary = (results or {}).get(phase)
        if not isinstance(summary, dict):
            continue
        if summary.get("total") is not None and summary["total"] != n:
            return None
        if summary.get("accuracy") is not None and abs(summary["accuracy"] - gain[f"{phase}_accuracy"]) > 1e-9:
            return None
    return gain


def resolve_gain(output_dir: str | Path, results: dict | None) -> dict | None:
    """The paired before/after gain of the run in ``output_dir`` whose ``eval_results.json`` is ``results``.

    ``results["gain"]`` when the run stored a usable one, else computed from ``eval_before.jsonl`` and
    ``eval_after.jsonl``; None (and the report leaves the numbers out, with a warning) when neither is there, when
    the files cannot be paired, or when they disagree with the before/after summaries.
    """
    stored = (results or {}).get("gain")
    if stored is not None:
        if usable_gain(stored, results) is not None:
            return stored
        logger.warning("%s: the stored gain does not match the before/after results; recomputing it", EVAL_FILE)
    try:
        gain = gain_from_run(output_dir)
    except (OSError, ValueError) as exc:
        logger.warning("no paired before/after interval in the report: %s", exc)
        return None
    if gain is not None and usable_gain(gain, results) is None:
        logger.warning(
            "no paired before/after interval in the report: eval_before.jsonl / eval_after.jsonl in %s do not match "
            "%s (another evaluation?)",
            output_dir,
            EVAL_FILE,
        )
        return None
    return gain
