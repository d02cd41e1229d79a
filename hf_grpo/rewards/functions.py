"""Reward functions for math reasoning, in the shape TRL's GRPOTrainer calls them.

Every function takes ``completions`` (strings, or conversational ``[{"role": "assistant", "content": ...}]``) plus
the dataset columns as keyword arguments, and returns one float per completion (``None`` = "cannot score", which
TRL skips). Recipes name them in ``reward_funcs`` and scale them with ``reward_weights``; seed 000's shaped reward
is ``[gsm8k_correctness, hash_format, length]`` with weights ``[1.0, 0.1, 0.05]``.

The correctness rewards are ``grade_completion`` per completion plus ``log_grades`` for the batch;
``GRADED_REWARDS`` maps each of them to its task, so ``hf_grpo.rewards.wrapper`` can grade in worker processes and
still report the same ``accuracy`` / ``grade/*`` metrics.

    >>> hash_format(["7 + 1 = 8\\n#### 8", "8"])
    [1.0, 0.0]
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from fractions import Fraction

from .grading import GRADES, grade


def completion_text(completion) -> str:
    """Text of a completion, whether plain (``str``) or conversational (list of messages)."""
    if isinstance(completion, str):
        return completion
    return "".join(message["content"] for message in completion if message.get("role", "assistant") == "assistant")


def _texts(completions) -> list[str]:
    return [completion_text(c) for c in completions]


def log_grades(grades: list[str], log_metric: Callable[[str, float], None] | None) -> None:
    """Report the fraction of correct / wrong / unparseable completions (``accuracy``, ``grade/*``)."""
    if log_metric is None or not grades:
        return
    n = len(grades)
    log_metric("accuracy", grades.count("correct") / n)
    for name in GRADES[1:]:
        log_metric(f"grade/{name}", grades.count(name) / n)


def grade_completion(task: str, completion, gold: str) -> str:
    """The grade of one completion for a correctness reward; ``task`` is ``"gsm8k"``, ``"math"``, ``"r1_zero"`` or
    ``"gsm8k_hash"``.

    ``"r1_zero"`` grades the ``<answer>`` content as MATH; a completion that breaks the format is unparseable.
    ``"gsm8k_hash"`` grades only what follows the completion's last ``####``; without ``####`` it is unparseable.

    >>> grade_completion("r1_zero", "<think>1+1</think> <answer>2</answer>", "\\\\boxed{2}")
    'correct'
    """
    text = completion_text(completion)
    if task == "r1_zero":
        answer = r1_zero_answer(text)
        return "unparseable" if answer is None else grade(f"\\boxed{{{answer}}}", gold, "math")
    if task == "gsm8k_hash":
        return "unparseable" if "####" not in text else grade("####" + text.rsplit("####", 1)[1], gold, "gsm8k")
    return grade(text, gold, task)


def _correctness(task: str, completions, solution: list[str], log_metric) -> list[float]:
    grades = [grade_completion(task, c, gold) for c, gold in zip(completions, solution, strict=True)]
    log_grades(grades, log_metric)
    return [1.0 if g == "correct" else 0.0 for g in grades]


def gsm8k_correctness(completions, solution, log_metric=None, **kwargs) -> list[float]:
    """1.0 if the completion's answer equals the GSM8K gold answer, else 0.0.

    >>> gsm8k_correctness(["3 + 4 = 7\\n#### 7", "#### 8"], solution=["#### 7", "#### 7"])
    [1.0, 0.0]
    """
    return _correctness("gsm8k", completions, solution, log_metric)


def hash_correctness(completions, solution, log_metric=None, **kwargs) -> list[float]:
    """1.0 if the number after the completion's last ``####`` equals the GSM8K gold answer, else 0.0.

    ``gsm8k_correctness`` also reads an answer the model did not mark (its last number, "the answer is N"), which a
    policy can collect by rambling to the token limit and ending on a lucky number; this one pays only for the
    answer where the prompt asked for it.

    >>> hash_correctness(["3 + 4 = 7\\n#### 7", "3 + 4 = 7", "#### 7 or 8"], solution=["#### 7"] * 3)
    [1.0, 0.0, 1.0]
    """
    return _correctness("gsm8k_hash", completions, solution, log_metric)


def math_correctness(completions, solution, log_metric=None, **kwargs) -> list[float]:
    """1.0 if math-verify finds the completion's answer equal to the MATH gold answer, else 0.0.

    >>> math_correctness(["so $\\\\boxed{\\\\frac{1}{2}}$"], solution=["\\\\boxed{0.5}"])
    [1.0]
    """
    return _correctness("math", completions, solution, log_metric)


_ANSWER_OPEN_RE = re.compile(r"\s*+<answer>")


def r1_zero_answer(text: str) -> str | None:
    """The ``<answer>`` content of an r1_zero completion, or None when the format is not respected.

    The format is ``<think> ... </think> <answer> ... </answer>`` and nothing else around it (whitespace aside);
    string searches, not a backtracking regex, so a long completion costs linear time. The opening ``<think>`` may
    be the prompt's: r1_zero's prompt ends with it (``hf_grpo.data.loaders.R1_ZERO_TEMPLATE``), as do the chat
    templates of R1-style models, so a completion that closes a think block it never opened continues that one.

    >>> r1_zero_answer("<think>2+2</think> <answer>4</answer>")
    '4'
    >>> r1_zero_answer(" 2+2 </think> <answer>4</answer>")  # the prompt opened <think>
    '4'
    >>> r1_zero_answer("<think>a</think> b <answer>4</answer>") is None
    True
    """
    text = text.strip()
    if not text.startswith("<think>"):
        if "<think>" in text:  # text before the think block
            return None
        text = "<think>" + text
    if not text.endswith("</answer>"):
        return None
    end = text.find("</think>")
    while end != -1:  # the thinking ends at the first </think> that is followed by the answer block
        opening = _ANSWER_OPEN_RE.match(text, end + len("</think>"))
        if opening:
            return text[opening.end() : -len("</answer>")].strip()
        end = text.find("</think>", end + 1)
    return None


def r1_zero_format(completions, **kwargs) -> list[float]:
    """1.0 for ``<think>...</think> <answer>...</answer>`` (seed 002's r1_zero format), else 0.0.

    >>> r1_zero_format(["<think>x</think> <answer>1</answer>", "<answer>1</answer>"])
    [1.0, 0.0]
    """
    return [1.0 if r1_zero_answer(t) is not None else 0.0 for t in _texts(completions)]


def r1_zero_correctness(completions, solution, log_metric=None, **kwargs) -> list[float]:
    """Seed 002's r1_zero answer reward: the ``<answer>`` content graded as MATH; bad format is unparseable.

    >>> r1_zero_correctness(["<think>1+1</think> <answer>2</answer>", "2"], solution=["\\\\boxed{2}"] * 2)
    [1.0, 0.0]
    """
    return _correctness("r1_zero", completions, solution, log_metric)


_THINK_RE = re.compile(r"^\s*<think>(?!.*<think>).*?</think>.*$", re.DOTALL)


def think_format(completions, **kwargs) -> list[float]:
    """1.0 if the completion opens with exactly one ``<think>...</think>`` block, else 0.0.

    >>> think_format(["<think>plan</think> 4", "4 <think>late</think>"])
    [1.0, 0.0]
    """
    return [1.0 if _THINK_RE.match(t) else 0.0 for t in _texts(completions)]


_HASH_ANSWER_RE = re.compile(r"####\s*+[-\u2212]?\s*+(?:\\?\$)?\s*+\d")  # possessive: no backtracking


def hash_format(completions, **kwargs) -> list[float]:
    """1.0 if the completion gives a final answer after ``####`` (seed 000's format term), else 0.0."""
    return [1.0 if _HASH_ANSWER_RE.search(t) else 0.0 for t in _texts(completions)]


_FINAL_HASH_RE = re.compile(r"####[ \t]*+[-\u2212]?\d[\d,]*+(?:\.\d++)?[ \t]*+\.?\s*+")  # the whole last line


def hash_final_format(completions, **kwargs) -> list[float]:
    """1.0 if the completion ends with its answer as GSM8K writes it, ``#### N`` on the last line, and uses ``####``
    only there; else 0.0. Stricter than ``hash_format``, which a policy games by repeating ``#### N`` lines.

    >>> hash_final_format(["7 + 1 = 8\\n#### 8", "#### 8\\n#### 9", "#### 8 and more"])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if "####" in t and _FINAL_HASH_RE.fullmatch(t, t.find("####")) else 0.0 for t in _texts(completions)]


def hash_final_format_if_correct(completions, solution, **kwargs) -> list[float]:
    """1.0 if the completion is right by ``hash_correctness`` and in ``hash_final_format``'s form, else 0.0: a bonus
    for ending on the answer that a guess cannot collect (a bare ``#### N`` earns it only when N is right).

    >>> hash_final_format_if_correct(["3 + 4 = 7\\n#### 7", "#### 7\\n#### 7", "#### 8"], solution=["#### 7"] * 3)
    [1.0, 0.0, 0.0]
    """
    right, formatted = hash_correctness(completions, solution), hash_final_format(completions)
    return [right_one * formatted_one for right_one, formatted_one in zip(right, formatted, strict=True)]


# A worked line of whole numbers, "7 * 9 = 63" (not part of "2.5 * 2 = 5" or "1,200 / 4 = 300").
_LINE_RE = re.compile(r"(?<![\d.,])(\d+)[ \t]*([-+*/])[ \t]*(\d+)[ \t]*=[ \t]*(\d+)(?![.,]?\d)")
_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul,
               "/": lambda a, b: Fraction(a, b) if b else None}  # fmt: skip  # exact: 9 / 6 is not 1


def false_arithmetic(completions, **kwargs) -> list[float]:
    """-1.0 if a worked line ``a op b = c`` of the completion is false (``8 * 3 = 28``; a division must come out
    whole), else 0.0. A penalty, not a pay: true lines earn nothing, so padding with them cannot collect it.

    >>> false_arithmetic(["8 * 3 = 24\\n#### 24", "8 * 3 = 28\\n#### 28", "#### 5", "9 / 6 = 1\\n#### 1"])
    [0.0, -1.0, 0.0, -1.0]
    """
    return [
        -1.0 if any(_OPERATIONS[op](int(a), int(b)) != int(c) for a, op, b, c in _LINE_RE.findall(text)) else 0.0
        for text in _texts(completions)
    ]


def length(completions, min_chars: int = 50, max_chars: int = 500, **kwargs) -> list[float]:
    """1.0 if ``min_chars < len(completion) < max_chars`` characters (seed 000's length term), else 0.0.

    >>> length(["x" * 60, "x"])
    [1.0, 0.0]
    """
    return [1.0 if min_chars < len(t) < max_chars else 0.0 for t in _texts(completions)]


def soft_overlong(completion_ids, max_completion_len: int, cache: int, **kwargs) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to ``max_completion_len - cache`` tokens, then linearly down to -1.

    >>> soft_overlong([[0] * 8, [0] * 14, [0] * 16], max_completion_len=16, cache=8)
    [0.0, -0.75, -1.0]
    """
    if not 0 < cache <= max_completion_len:
        raise ValueError(f"soft_overlong needs 0 < cache <= max_completion_len, got {cache} and {max_completion_len}")
    start = max_completion_len - cache
    return [max(-1.0, min(0.0, (start - len(ids)) / cache)) for ids in completion_ids]


# TRL's reward factories (``trl.rewards.get_*``) build a reward from settings. Recipes name a reward rather than
# call a factory, so each factory has a module-level counterpart here taking the settings as keyword arguments:
# ``reward_kwargs`` set them, and the reward still pickles by reference for the reward workers.


def trl_soft_overlong_punishment(
    completion_ids, max_completion_len: int = 1280, soft_punish_cache: int = 256, **kwargs
) -> list[float]:
    """TRL's ``get_soft_overlong_punishment(max_completion_len, soft_punish_cache)`` as a reward.

    The defaults are those ``trl grpo --reward_funcs get_soft_overlong_punishment`` uses; set them to your
    ``max_completion_length`` with ``reward_kwargs``. Our ``soft_overlong`` is the same punishment.

    >>> trl_soft_overlong_punishment([[0] * 8, [0] * 14], max_completion_len=16, soft_punish_cache=8)
    [0.0, -0.75]
    """
    from trl.rewards import get_soft_overlong_punishment  # lazy: importing trl costs seconds of start-up

    return get_soft_overlong_punishment(max_completion_len, soft_punish_cache)(completion_ids)


def trl_repetition_penalty(completion_ids, ngram_size: int = 3, max_penalty: float = -1.0, **kwargs) -> list[float]:
    """TRL's ``get_repetition_penalty_reward(ngram_size, max_penalty)`` as a reward (TRL's defaults).

    >>> trl_repetition_penalty([[1, 2, 3, 4], [5, 5, 5, 5, 5]], ngram_size=2)
    [0.0, -0.75]
    """
    from trl.rewards import get_repetition_penalty_reward  # lazy: importing trl costs seconds of start-up

    return get_repetition_penalty_reward(ngram_size, max_penalty)(completion_ids)


def trl_cosine_scaled_reward(
    completions,
    solution,
    completion_ids,
    *,
    max_len: int,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    **kwargs,
) -> list[float | None]:
    """TRL's ``get_cosine_scaled_reward(max_len, ...)`` as a reward; ``max_len`` must come from ``reward_kwargs``.

    Like TRL's ``accuracy_reward``, which it calls, it reads conversational completions only.
    """
    from trl.rewards import get_cosine_scaled_reward  # lazy: importing trl costs seconds of start-up

    reward = get_cosine_scaled_reward(max_len, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct)
    return reward(completions, solution, completion_ids)


# TRL factory name -> the reward standing for it (``resolve_reward`` returns these for TRL's factory names).
TRL_FACTORY_REWARDS: dict[str, Callable] = {
    "get_soft_overlong_punishment": trl_soft_overlong_punishment,
    "get_repetition_penalty_reward": trl_repetition_penalty,
    "get_cosine_scaled_reward": trl_cosine_scaled_reward,
}

# The correctness rewards and their grading task (``grade_completion``): they report accuracy and grade fractions.
GRADED_REWARDS: dict[Callable, str] = {
    gsm8k_correctness: "gsm8k",
    math_correctness: "math",
    r1_zero_correctness: "r1_zero",
    hash_correctness: "gsm8k_hash",
}

REWARD_FUNCS: dict[str, Callable] = {
    "gsm8k_correctness": gsm8k_correctness,
    "hash_correctness": hash_correctness,
    "math_correctness": math_correctness,
    "r1_zero_correctness": r1_zero_correctness,
    "r1_zero_format": r1_zero_format,
    "think_format": think_format,
    "hash_format": hash_format,
    "hash_final_format": hash_final_format,
    "hash_final_format_if_correct": hash_final_format_if_correct,
    "false_arithmetic": false_arithmetic,
    "length": length,
    "soft_overlong": soft_overlong,
}
