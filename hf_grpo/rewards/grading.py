"""Answer extraction and grading: the one place that decides whether a completion is right.

``grade(completion, gold, task)`` returns ``"correct"``, ``"wrong"`` (an answer was extracted but is not equal to
the gold one) or ``"unparseable"`` (no answer could be extracted). Rewards, the per-step grade metrics, the
evaluator and the tests all go through it, so a change here changes every number the project reports.

GSM8K (``task="gsm8k"``): the gold answer is the text after ``####`` (or the whole string if there is none). The
prediction is, in order of preference: the text after the last ``####``, the last ``\\boxed{...}``, the number after
"answer is" / "answer:", and finally the last number in the completion (lm-eval's "flexible" extraction). Numbers
are compared as exact rationals after removing ``$``, thousands separators, units and a trailing ``%``, so
``$1,234.00``, ``1234`` and ``1,234 dollars`` are equal, and ``3/4`` equals ``0.75``.

MATH (``task="math"``): the gold answer is the content of the last ``\\boxed{}`` in the gold solution (or the
whole string). Equivalence is decided by math-verify with the gold answer first (the argument order matters:
``verify`` is deliberately asymmetric). A completion is unparseable when math-verify extracts nothing from it.

math-verify's own timeouts use ``signal.alarm`` and only work in a main thread, and they cannot interrupt a long
C-level SymPy call (huggingface/Math-Verify#65). They are disabled here; hard timeouts are enforced by running
grading in killable worker processes (``hf_grpo.rewards.isolation``).

    >>> grade("5 + 3 = 8\\n#### 8", "#### 8", "gsm8k")
    'correct'
    >>> grade("The answer is $1,234.00.", "1234", "gsm8k")
    'correct'
    >>> grade("I am not sure.", "18", "gsm8k")
    'unparseable'
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction


GRADES = ("correct", "wrong", "unparseable")
TASKS = ("gsm8k", "math")

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*\$?\s*(" + _NUMBER + ")", re.IGNORECASE)
_FRAC_RE = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces; None if there is none.

    >>> last_boxed(r"so \\boxed{1} and finally \\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def to_number(text: str) -> Fraction | None:
    """Parse a GSM8K-style number (``$1,234.50``, ``-3``, ``3/4``, ``\\frac{3}{4}``, ``25%``) as an exact Fraction.

    >>> to_number("$1,234.50")
    Fraction(2469, 2)
    """
    text = text.strip().replace("\\$", "").replace("$", "").replace("\\!", "").replace("{,}", ",")
    frac = _FRAC_RE.search(text)
    if frac:
        num, den = int(frac.group(1)), int(frac.group(2))
        return Fraction(num, den) if den else None
    match = _NUMBER_RE.search(text)
    if not match:
        return None
    token = match.group(0).replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return Fraction(Fraction(num), Fraction(den)) if Fraction(den) else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def extract_gsm8k(completion: str) -> Fraction | None:
    """The predicted number of a GSM8K completion, or None when none can be found (see module docstring)."""
    if "####" in completion:
        tail = completion.rsplit("####", 1)[1]
        return to_number(tail)
    boxed = last_boxed(completion)
    if boxed is not None:
        return to_number(boxed)
    said = _ANSWER_IS_RE.findall(completion)
    if said:
        return to_number(said[-1])
    numbers = _NUMBER_RE.findall(completion.replace("\\$", "$"))
    return to_number(numbers[-1]) if numbers else None


def gsm8k_gold(gold: str) -> Fraction | None:
    """The gold number of a GSM8K answer (text after ``####``, or the whole string)."""
    return to_number(gold.rsplit("####", 1)[1] if "####" in gold else gold)


def _grade_gsm8k(completion: str, gold: str) -> str:
    target = gsm8k_gold(gold)
    if target is None:
        raise ValueError(f"gold answer {gold!r} has no number; GSM8K gold answers end with '#### <number>'")
    predicted = extract_gsm8k(completion)
    if predicted is None:
        return "unparseable"
    return "correct" if predicted == target else "wrong"


def math_gold(gold: str) -> str:
    """The gold answer of a MATH solution: its last ``\\boxed{}`` content, or the whole string."""
    boxed = last_boxed(gold)
    return boxed if boxed is not None else gold.strip()


def _grade_math(completion: str, gold: str) -> str:
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):  # "timeout disabled" warnings are expected here
        logging.getLogger(name).setLevel(logging.ERROR)
    gold_parsed = parse(
        f"${math_gold(gold)}$",
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,
    )
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} could not be parsed by math-verify")
    predicted = parse(
        completion,
        extraction_config=[
            LatexExtractionConfig(
                normalization_config=NormalizationConfig(units=True, malformed_operators=False, boxed="all"),
                boxed_match_priority=0,
                try_extract_without_anchor=False,
            ),
            ExprExtractionConfig(try_extract_without_anchor=False),
        ],
        extraction_mode="first_match",
        parsing_timeout=None,
    )
    if not predicted:
        return "unparseable"
    return "correct" if verify(gold_parsed, predicted, timeout_seconds=None) else "wrong"


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
