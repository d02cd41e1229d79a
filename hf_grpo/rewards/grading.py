"""Answer extraction and grading: the one place that decides whether a completion is right.

``grade(completion, gold, task)`` returns ``"correct"``, ``"wrong"`` or ``"unparseable"`` (``task="gsm8k"``: exact
rationals; ``task="math"``: math-verify). Rewards, grade metrics, the evaluator and the tests all go through it;
``check_gold_format`` warns when gold answers do not fit their task. Rules and timeouts: docs/grading.md.

    >>> grade("5 + 3 = 8\\n#### 8", "#### 8", "gsm8k")
    'correct'
    >>> grade("The answer is $1,234.00.", "1234", "gsm8k")
    'correct'
    >>> grade("I am not sure.", "18", "gsm8k")
    'unparseable'
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction


GRADES = ("correct", "wrong", "unparseable")
TASKS = ("gsm8k", "math")

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+"
_FRAC_PART = r"(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))"  # \frac{12}{5} or the brace-less \frac34
_FRAC = rf"(-?)\\[dt]?frac\s*{_FRAC_PART}\s*{_FRAC_PART}"
_TOKEN_RE = re.compile(rf"{_FRAC}|{_NUMBER}")  # a fraction or a number, whichever starts first
# "The answer is 18", "**Answer:** 18", "The answer is \(18\)", "answer = \frac{3}{4}"
_ANSWER_IS_RE = re.compile(rf"answer\s*(?:is|:|=)(?:[\s:*]|\\\()*((?:{_FRAC}|{_NUMBER}))", re.IGNORECASE)
_DIGIT_SEPARATOR_RE = re.compile(r"(?<=\d)(?:\{,\}|\\,)(?=\d)")  # LaTeX thousands separators: 2{,}000, 2\,000
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# a whole gold answer that is one number (after _clean): "72", "1,234.5", "-3/4", "\frac{3}{4}", "25%", "72."
_BARE_NUMBER_RE = re.compile(rf"(?:{_FRAC}|{_NUMBER})\s*+%?\.?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces; None if there is none.

    >>> last_boxed(r"so \\boxed{1} and finally \\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    starts = list(_BOXED_RE.finditer(text))
    if not starts:
        return None
    i = starts[-1].end() - 1  # the opening brace
    end = _closing_brace(text, i)
    return None if end is None else text[i + 1 : end].strip()


def _closing_brace(text: str, start: int) -> int | None:
    """The index of the brace that closes the ``{`` at ``start``; None when it is never closed."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _clean(text: str) -> str:
    """Remove what may sit inside or around a written number: ``$`` / ``\\$``, LaTeX separators, a Unicode minus."""
    text = text.replace("\u2212", "-").replace("\\$", "").replace("$", "").replace("\\!", "")
    return _DIGIT_SEPARATOR_RE.sub(",", text)


def _token_value(match: re.Match) -> Fraction | None:
    sign, num_braced, num_digit, den_braced, den_digit = match.groups()
    try:
        if num_braced or num_digit:  # a \frac
            value = Fraction(num_braced or num_digit) / Fraction(den_braced or den_digit)
            return -value if sign else value
        token = match.group(0).replace(",", "").replace(" ", "")
        if "/" in token:
            num, den = token.split("/")
            return Fraction(num) / Fraction(den)
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def to_number(text: str) -> Fraction | None:
    """Parse the first GSM8K-style number in ``text`` (``$1,234.50``, ``-3``, ``3/4``, ``\\frac{3}{4}``, ``25%``).

    The result is an exact Fraction, or None when there is no number.

    >>> to_number("$1,234.50")
    Fraction(2469, 2)
    >>> to_number("-\\\\frac{3}{4} cup")
    Fraction(-3, 4)
    """
    match = _TOKEN_RE.search(_clean(text))
    return _token_value(match) if match else None


def extract_gsm8k(completion: str) -> Fraction | None:
    """The predicted number of a GSM8K completion, or None when none can be found (see module docstring).

    Each place is tried in order of preference, and a place that holds no number (``####`` at the very end of a
    cut-off completion, ``\\boxed{}``) falls through to the next one.
    """
    text = _clean(completion)
    said = list(_ANSWER_IS_RE.finditer(text))
    numbers = list(_TOKEN_RE.finditer(text))
    places = (
        completion.rsplit("####", 1)[1] if "####" in completion else None,
        last_boxed(completion),
        said[-1].group(1) if said else None,
        numbers[-1].group(0) if numbers else None,
    )
    for place in places:
        if place is not None and (predicted := to_number(place)) is not None:
            return predicted
    return None


def bare_number(text: str) -> Fraction | None:
    """The value of ``text`` when it is one number and nothing else (``$``, a ``%`` or a final period aside).

    >>> bare_number(" $1,234. ")
    Fraction(1234, 1)
    >>> bare_number("8 + 7 = 15") is None
    True
    """
    return to_number(text) if _BARE_NUMBER_RE.fullmatch(_clean(text).strip()) else None


def gsm8k_gold(gold: str) -> Fraction | None:
    """The gold number of a GSM8K answer, or None when ``gold`` is not GSM8K-shaped.

    GSM8K gold ends with ``#### <number>``; without ``####`` the whole string must be a bare number. A worked
    solution without ``####`` is refused rather than read as its first number (which graded "8 + 7 = 15" as 8).

    >>> gsm8k_gold("48 / 2 = 24\\n24 + 48 = 72\\n#### 72")
    Fraction(72, 1)
    >>> gsm8k_gold("15")
    Fraction(15, 1)
    >>> gsm8k_gold("8 + 7 = 15") is None
    True
    """
    return bare_number(gold.rsplit("####", 1)[1] if "####" in gold else gold)


def _grade_gsm8k(completion: str, gold: str) -> str:
    target = gsm8k_gold(gold)
    if target is None:
        raise ValueError(
            f"gold answer {gold!r} is not GSM8K gold: it needs '#### <number>' at the end or to be a bare number"
        )
    predicted = extract_gsm8k(completion)
    if predicted is None:
        return "unparseable"
    return "correct" if predicted == target else "wrong"


def math_gold(gold: str) -> str:
    """The gold answer of a MATH solution: its last ``\\boxed{}`` content, or the whole string."""
    boxed = last_boxed(gold)
    return boxed if boxed is not None else gold.strip()


# How each task writes its gold answers (for messages), and how a gold answer of that task is recognised.
GOLD_FORMATS = {"gsm8k": "'#### N' or a number", "math": "\\boxed{...} or a short answer"}
GOLD_MARKS = {"gsm8k": "'#### N'", "math": "\\boxed{...}"}
GOLD_WARN_SHARE = 0.2  # check_gold_format warns from this share of gold answers that do not fit the task
_SHORT_ANSWER_CHARS = 100  # MATH-500 / OpenMathInstruct-2 answers ("\frac{14}{3}", "(3, \frac{\pi}{2})") are shorter


def fits_task(gold: str, task: str) -> bool:
    """Whether ``gold`` is written the way ``task`` writes its gold answers (a shape check, cheap, no math-verify).

    GSM8K: ``gsm8k_gold`` reads it (``#### N`` or a bare number). MATH: a non-empty ``\\boxed{}`` (a worked MATH
    solution), or a short one-line answer without ``####`` (MATH-500's ``answer`` column, a bare number); a
    GSM8K solution or a long text without a box is not MATH gold, since ``math_gold`` would hand all of it to
    math-verify.

    >>> fits_task("so 7 + 8 = 15\\n#### 15", "gsm8k"), fits_task("so 7 + 8 = 15\\n#### 15", "math")
    (True, False)
    >>> fits_task("So $\\\\boxed{15}$.", "gsm8k"), fits_task("So $\\\\boxed{15}$.", "math")
    (False, True)
    """
    if task == "gsm8k":
        return gsm8k_gold(gold) is not None
    if task == "math":
        if last_boxed(gold):
            return True
        text = gold.strip()
        return bool(text) and "####" not in text and "\n" not in text and len(text) <= _SHORT_ANSWER_CHARS
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def gold_shape(gold: str) -> str | None:
    """The task whose distinctive mark ``gold`` carries: ``"gsm8k"`` (``#### N``), ``"math"`` (``\\boxed{...}``),
    or None (a bare number, which both tasks read, or neither mark)."""
    if "####" in gold and gsm8k_gold(gold) is not None:
        return "gsm8k"
    if last_boxed(gold):
        return "math"
    return None


def check_gold_format(task: str, golds: Sequence[str], threshold: float = GOLD_WARN_SHARE) -> str | None:
    """A one-line warning when at least ``threshold`` of ``golds`` do not fit ``task``'s gold format, else None.

    ``golds`` is a sample of a dataset's gold answers (a few hundred rows are plenty); each is checked with
    ``fits_task``. The message names the count, the task and, when most of the misfits carry another task's mark,
    that task; otherwise it shows the first misfit. A gold column that does not match the task is a recipe mistake
    (``task``, ``solution_column``) that grading alone would not reveal: GSM8K grading used to read a MATH solution
    as its first number.

    >>> print(check_gold_format("gsm8k", ["The sum is $\\\\boxed{15}$.", "#### 3"]))
    1 of 2 sampled gold answers do not parse as gsm8k gold ('#### N' or a number); they look like math (\\boxed{...})
    >>> check_gold_format("gsm8k", ["#### 15", "3"]) is None
    True
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    golds = [str(gold) for gold in golds]
    misfits = [gold for gold in golds if not fits_task(gold, task)]
    if not golds or len(misfits) / len(golds) < threshold:
        return None
    message = f"{len(misfits)} of {len(golds)} sampled gold answers do not parse as {task} gold ({GOLD_FORMATS[task]})"
    shape, count = Counter(gold_shape(gold) for gold in misfits).most_common(1)[0]
    if shape is not None and shape != task and 2 * count >= len(misfits):
        return f"{message}; they look like {shape} ({GOLD_MARKS[shape]})"
    marks = " nor ".join(f"{name} ({mark})" for name, mark in GOLD_MARKS.items())
    return f"{message}; they look like neither {marks} (first: {misfits[0][:80]!r})"


MAX_POWER_DIGITS = 10**6  # a power with more digits than this is not computed (SymPy would for ever: Math-Verify#65)
_POWER_RE = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*")


def _group(text: str, start: int) -> tuple[str, int]:
    """The exponent at ``start`` (just after ``^``): a balanced ``{...}`` group's content, or one character."""
    if start >= len(text) or text[start] != "{":
        return text[start : start + 1], start + 1
    end = _closing_brace(text, start)
    return (text[start + 1 :], len(text)) if end is None else (text[start + 1 : end], end + 1)


def power_digits(text: str) -> float:
    """An upper estimate of the number of decimal digits of the largest number ``text`` writes with ``^``: each
    ``N^{...}`` has about ``value(exponent) * log10(N)`` digits, where the exponent's value is its own largest number
    or power (``+ 4`` and the like are ignored: they do not change the order of magnitude). ``inf`` when a tower's
    exponent is itself beyond floating point."""
    digits, position = 0.0, 0
    while (match := _POWER_RE.search(text, position)) is not None:
        exponent, position = _group(text, match.end())
        numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", exponent)] or [1.0]
        exponent_digits = max(power_digits(exponent), math.log10(max(max(numbers), 1.0)))
        value = math.inf if exponent_digits > 300 else 10**exponent_digits
        digits = max(digits, value * math.log10(max(float(match.group(1)), 1.0)))
    return digits


def _grade_math(completion: str, gold: str) -> str:
    from latex2sympy2_extended import NormalizationConfig  # lazy: SymPy costs seconds of start-up (GSM8K needs none)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):  # "timeout disabled" warnings are expected here
        logging.getLogger(name).setLevel(logging.ERROR)
    if power_digits(math_gold(gold)) > MAX_POWER_DIGITS:
        raise ValueError(f"gold answer {gold!r} writes a number of more than {MAX_POWER_DIGITS} digits")
    gold_parsed = parse(
        f"${math_gold(gold)}$",
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,
    )
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} could not be parsed by math-verify")
    config = [
        LatexExtractionConfig(
            # malformed_operators reads \frac12 and \sqrt2 as the gold side does; without it they stay strings
            normalization_config=NormalizationConfig(units=True, malformed_operators=True, boxed="all"),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        ),
        ExprExtractionConfig(try_extract_without_anchor=False),
    ]
    readings = [completion]
    boxed = last_boxed(completion)
    if boxed is not None and len(_BOXED_RE.findall(completion)) > 1:
        # The last \boxed{} counts: math-verify alone joins boxes a comma or "and" apart, so "\boxed{5}. Wait,
        # actually \boxed{7}" would read {5, 7}. Its own reading is kept second, for one answer split over several
        # boxes ("$\boxed{-2}$ and $\boxed{3}$" for the gold "-2, 3").
        readings.insert(0, f"\\boxed{{{boxed}}}")
    result = "unparseable"
    for text in readings:
        answer = last_boxed(text)  # what math-verify reads first (boxed_match_priority=0)
        if power_digits(text if answer is None else answer) > MAX_POWER_DIGITS:  # SymPy would compute for ever
            # a boxed answer of over a million digits equals no gold answer (such golds are refused above)
            result = "wrong" if answer is not None and result == "unparseable" else result
            continue
        predicted = parse(text, extraction_config=config, extraction_mode="first_match", parsing_timeout=None)
        if predicted:
            if verify(gold_parsed, predicted, timeout_seconds=None):
                return "correct"
            result = "wrong"
    return result


def grade(completion: str, gold: str, task: str) -> str:
    """Grade one completion against its gold answer: ``"correct"``, ``"wrong"`` or ``"unparseable"``.

    Raises ``ValueError`` for an unknown ``task`` or a gold answer that cannot be read (a data problem, never the
    model's fault).
    """
    if task == "gsm8k":
        return _grade_gsm8k(completion, gold)
    if task == "math":
        return _grade_math(completion, gold)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
