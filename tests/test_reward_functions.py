"""The reward functions built on grading (``hf_grpo.rewards.functions``): the registry, the correctness rewards on
plain and conversational completions with their logged grade metrics, the format rewards, length and soft_overlong."""

from __future__ import annotations

import pytest

from hf_grpo.rewards.functions import (
    REWARD_FUNCS,
    completion_text,
    false_arithmetic,
    gsm8k_correctness,
    hash_correctness,
    hash_final_format_if_correct,
    hash_format,
    length,
    math_correctness,
    r1_zero_correctness,
    r1_zero_format,
    soft_overlong,
    think_format,
)


# --------------------------------------------------------------------------------------------- reward functions


class MetricLog:
    def __init__(self):
        self.values: dict[str, float] = {}

    def __call__(self, name: str, value: float) -> None:
        assert name not in self.values, f"{name} logged twice"
        self.values[name] = value


def conversational(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def assert_grade_metrics(log: MetricLog, correct: float, wrong: float, unparseable: float) -> None:
    assert set(log.values) == {"accuracy", "grade/wrong", "grade/unparseable"}
    assert log.values["accuracy"] == pytest.approx(correct)
    assert log.values["grade/wrong"] == pytest.approx(wrong)
    assert log.values["grade/unparseable"] == pytest.approx(unparseable)
    assert sum(log.values.values()) == pytest.approx(1.0)


def test_completion_text():
    assert completion_text("plain") == "plain"
    assert completion_text(conversational("hi")) == "hi"
    messages = [
        {"role": "assistant", "content": "<think>a</think>"},
        {"role": "tool", "content": "IGNORED"},
        {"role": "assistant", "content": " 4"},
        {"content": "!"},  # no role: assistant
    ]
    assert completion_text(messages) == "<think>a</think> 4!"


def test_reward_funcs_registry():
    assert set(REWARD_FUNCS) == {
        "gsm8k_correctness",
        "hash_correctness",
        "math_correctness",
        "r1_zero_correctness",
        "r1_zero_format",
        "think_format",
        "hash_format",
        "hash_final_format",
        "hash_final_format_if_correct",
        "false_arithmetic",
        "length",
        "soft_overlong",
    }
    assert all(fn.__name__ == name for name, fn in REWARD_FUNCS.items())


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_gsm8k_correctness(wrap):
    completions = [
        wrap("3 + 4 = 7\n#### 7"),
        wrap("The answer is $1,234.00."),
        wrap("3 + 4 = 8\n#### 8"),
        wrap("I don't know."),
    ]
    log = MetricLog()
    rewards = gsm8k_correctness(
        completions, solution=["#### 7", "#### 1234", "#### 7", "#### 7"], log_metric=log, prompts=["p"] * 4
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert_grade_metrics(log, correct=0.5, wrong=0.25, unparseable=0.25)


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_hash_correctness_pays_only_for_the_answer_after_the_last_hashes(wrap):
    """What gsm8k_correctness reads anywhere (a last number, "the answer is"), this one does not: a policy that
    rambles to the token limit and ends on a lucky number gets nothing."""
    completions = [
        wrap("3 + 4 = 7\n#### 7"),
        wrap("3 + 4 = 7, so she has 7 apples and then"),  # right last number, unmarked
        wrap("The answer is 7."),
        wrap("#### 8\nno wait\n#### 7"),  # the last '####' counts
        wrap("#### 7\n#### 8"),
        wrap("3 + 4 = 7 ####"),  # '####' with no number after it: not read from before it
    ]
    gold = ["#### 7"] * 6
    log = MetricLog()
    assert hash_correctness(completions, solution=gold, log_metric=log) == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert gsm8k_correctness(completions, solution=gold) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert_grade_metrics(log, correct=2 / 6, wrong=1 / 6, unparseable=3 / 6)


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_the_format_bonus_needs_a_right_answer_ending_the_completion(wrap):
    """The real-model recipe's bonus: a bare guess earns it only when it is right, a right answer only when
    ``#### N`` ends the completion and is its only ``####``."""
    completions = [
        wrap("3 + 4 = 7\n#### 7"),
        wrap("#### 7"),  # a bare guess, right
        wrap("#### 8"),  # a bare guess, wrong
        wrap("3 + 4 = 7\n#### 7\n#### 7"),  # right, the answer said twice
        wrap("#### 7\nShe has 7 apples."),  # right, a sentence after it
        wrap("3 + 4 = 8\n#### 8"),  # formatted, wrong
    ]
    assert hash_final_format_if_correct(completions, solution=["#### 7"] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_false_arithmetic_penalizes_a_false_worked_line_and_pays_nothing_for_true_ones(wrap):
    """What GRPO broke on the real model ('8 * 3 = 28' for 3 notebooks at 8 dollars): a line that is false costs the
    completion -1 whatever its answer; lines that are true, or no lines, cost nothing and earn nothing."""
    completions = [
        wrap("3 * 8 = 24\n#### 24"),
        wrap("8 * 3 = 28\n#### 28"),  # false
        wrap("7 jars of 9 apples: 7 * 9 = 63\n63 - 20 = 43\n#### 43"),  # named lines, true
        wrap("10 + 0 = 10\n10 + 0 = 10\n2 + 2 = 5\n#### 5"),  # padding does not hide a false line
        wrap("9 / 6 = 1\n#### 1"),  # a division that does not come out whole
        wrap("#### 24"),
        wrap("2.5 * 2 = 5, and 1,200 / 4 = 300\n#### 300"),  # not whole-number lines: not read
    ]
    assert false_arithmetic(completions) == [0.0, -1.0, 0.0, -1.0, -1.0, 0.0, 0.0]


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_math_correctness(wrap):
    completions = [
        wrap("So the probability is $\\boxed{\\frac{1}{2}}$."),
        wrap("The answer is $\\boxed{\\frac12}$."),
        wrap("Hence $\\boxed{3}$."),
        wrap("Hmm."),
        wrap(""),
    ]
    log = MetricLog()
    rewards = math_correctness(completions, solution=["The answer is \\boxed{0.5}."] * 5, log_metric=log)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert_grade_metrics(log, correct=0.4, wrong=0.2, unparseable=0.4)


def test_correctness_without_log_metric_and_with_no_completions():
    assert gsm8k_correctness(["#### 7"], solution=["#### 7"]) == [1.0]
    log = MetricLog()
    assert gsm8k_correctness([], solution=[], log_metric=log) == []
    assert log.values == {}  # nothing to average over: no metric rather than a division by zero


def test_correctness_needs_one_solution_per_completion():
    with pytest.raises(ValueError):
        gsm8k_correctness(["#### 7", "#### 8"], solution=["#### 7"])


def test_correctness_propagates_bad_gold():
    with pytest.raises(ValueError, match="gold answer"):
        gsm8k_correctness(["#### 7"], solution=["no number"])


@pytest.mark.parametrize("wrap", [str, conversational], ids=["plain", "conversational"])
def test_r1_zero_correctness(wrap):
    completions = [
        wrap("<think>1 + 1 = 2</think> <answer>2</answer>"),
        wrap("<think>\nhalf of 4\n</think>\n<answer>\\frac{4}{2}</answer>\n"),
        wrap("<think>1 + 1 = 3</think> <answer>3</answer>"),
        wrap("<think>no answer tag</think> 2"),
        wrap("2"),
        wrap("<think>x</think> <answer></answer>"),
        wrap(" 1 + 1 = 2 </think> <answer> 2 </answer>"),  # r1_zero's prompt ends with <think>
    ]
    log = MetricLog()
    rewards = r1_zero_correctness(completions, solution=["$\\boxed{2}$"] * 7, log_metric=log)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert_grade_metrics(log, correct=3 / 7, wrong=1 / 7, unparseable=3 / 7)


def test_r1_zero_prompt_and_reward_agree():
    """The r1_zero prompt opens <think>, so a right completion written after it must earn the reward."""
    from hf_grpo.data.loaders import DataArguments, format_prompt

    prompt = format_prompt("What is 1 + 1?", DataArguments(prompt_style="r1_zero"))
    assert prompt.rstrip().endswith("<think>")
    assert r1_zero_correctness([" 1 + 1 = 2 </think> <answer> 2 </answer>"], solution=["\\boxed{2}"]) == [1.0]
    assert r1_zero_format([" 1 + 1 = 2 </think> <answer> 2 </answer>"]) == [1.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("<think>x</think> <answer>1</answer>", 1.0, id="ok"),
        pytest.param("\n<think>\nlong\nreasoning\n</think>\n\n<answer>\n1\n</answer>\n", 1.0, id="ok-newlines"),
        pytest.param("<think>x</think><answer>1</answer>", 1.0, id="ok-no-space"),
        pytest.param(" x </think> <answer>1</answer>", 1.0, id="think-opened-by-the-prompt"),
        pytest.param("x </think> y </think> <answer>1</answer>", 1.0, id="opened-by-prompt-two-closings"),
        pytest.param("<answer>1</answer>", 0.0, id="no-think"),
        pytest.param("<think>x</think> 1", 0.0, id="no-answer"),
        pytest.param("<think>x</think> <answer>1</answer> Hope this helps!", 0.0, id="text-after-answer"),
        pytest.param("Sure! <think>x</think> <answer>1</answer>", 0.0, id="text-before-think"),
        pytest.param("<think>x <answer>1</answer>", 0.0, id="unclosed-think"),
        pytest.param("", 0.0, id="empty"),
    ],
)
def test_r1_zero_format(text, expected):
    assert r1_zero_format([text]) == [expected]
    assert r1_zero_format([conversational(text)]) == [expected]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("<think>plan</think> 4", 1.0, id="ok"),
        pytest.param("  <think>\nplan\n</think>\nThe answer is 4.", 1.0, id="ok-leading-whitespace"),
        pytest.param("<think>plan</think>", 1.0, id="ok-nothing-after"),
        pytest.param("4 <think>late</think>", 0.0, id="think-not-first"),
        pytest.param("<think>a</think> <think>b</think> 4", 0.0, id="two-think-blocks"),
        pytest.param("<think>never closed", 0.0, id="unclosed"),
        pytest.param("The answer is 4.", 0.0, id="no-think"),
        pytest.param("", 0.0, id="empty"),
    ],
)
def test_think_format(text, expected):
    assert think_format([text]) == [expected]
    assert think_format([conversational(text)]) == [expected]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("7 + 1 = 8\n#### 8", 1.0, id="ok"),
        pytest.param("####8", 1.0, id="ok-no-space"),
        pytest.param("#### -3", 1.0, id="ok-negative"),
        pytest.param("#### $1,234", 1.0, id="ok-money"),
        pytest.param("The answer is 8.", 0.0, id="no-hashes"),
        pytest.param("#### eight", 0.0, id="no-number-after-hashes"),
        pytest.param("8\n####", 0.0, id="hashes-at-end"),
        pytest.param("", 0.0, id="empty"),
    ],
)
def test_hash_format(text, expected):
    assert hash_format([text]) == [expected]
    assert hash_format([conversational(text)]) == [expected]


def test_length():
    texts = ["x" * n for n in (0, 50, 51, 499, 500)]
    assert length(texts) == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert length([conversational("x" * 60)]) == [1.0]
    assert length(["x" * 10, "x" * 20], min_chars=5, max_chars=15) == [1.0, 0.0]


def test_soft_overlong():
    # DAPO: 0 up to max_len - cache tokens, then (max_len - cache - len) / cache, and -1 from max_len on.
    ids = [[0] * n for n in (0, 8, 10, 12, 14, 16, 40)]
    assert soft_overlong(ids, max_completion_len=16, cache=8) == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert soft_overlong([[0] * 16], max_completion_len=16, cache=16) == [-1.0]
    assert soft_overlong([[0] * 15, [0] * 16], max_completion_len=16, cache=1, completions=["a", "b"]) == [0.0, -1.0]


@pytest.mark.parametrize("cache", [0, -1, 17])
def test_soft_overlong_rejects_bad_cache(cache):
    with pytest.raises(ValueError, match="cache"):
        soft_overlong([[0]], max_completion_len=16, cache=cache)
