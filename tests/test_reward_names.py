"""How a recipe names rewards (``resolve_reward``, ``reward_name``) and how gold answers are read per task.

Rewards: our built-in names, TRL's reward names as ``trl grpo`` accepts them, dotted paths and ``module:function``
all resolve to the function itself (module-level, so it pickles by reference for the reward workers); an unknown
name lists both registries with a did-you-mean. Gold: ``gsm8k_gold`` reads only GSM8K-shaped gold (``#### N`` or a
bare number), and ``check_gold_format`` says when a sample of gold answers is written for another task.
"""

from __future__ import annotations

import functools
import pickle
import sys
from fractions import Fraction

import pytest
import trl.rewards

from hf_grpo.data.arithmetic import make_split
from hf_grpo.rewards import (
    REWARD_FUNCS,
    RewardArguments,
    RewardLoadError,
    load_reward_funcs,
    resolve_reward,
    reward_name,
    trl_reward_names,
)
from hf_grpo.rewards.functions import (
    TRL_FACTORY_REWARDS,
    gsm8k_correctness,
    trl_cosine_scaled_reward,
    trl_repetition_penalty,
    trl_soft_overlong_punishment,
)
from hf_grpo.rewards.grading import check_gold_format, fits_task, grade, gsm8k_gold


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# ------------------------------------------------------------------------------------------------ reward spellings


@pytest.mark.parametrize("name", sorted(REWARD_FUNCS))
def test_builtin_names_resolve_to_our_functions_in_every_spelling(name):
    fn = REWARD_FUNCS[name]
    assert resolve_reward(name) is fn
    assert resolve_reward(f"hf_grpo.rewards.functions:{name}") is fn
    assert resolve_reward(f"hf_grpo.rewards.functions.{name}") is fn  # dotted path: new


TRL_PLAIN = ["accuracy_reward", "reasoning_accuracy_reward", "think_format_reward"]


@pytest.mark.parametrize("name", TRL_PLAIN)
@pytest.mark.parametrize(
    "spelling",
    [
        "{name}",
        "trl.rewards.{name}",
        "trl.rewards:{name}",
        "trl.rewards.{module}.{name}",
        "trl.rewards.{module}:{name}",
    ],
    ids=["bare", "dotted", "colon", "dotted-submodule", "colon-submodule"],
)
def test_trl_reward_names_resolve_to_trls_own_function(name, spelling):
    fn = getattr(trl.rewards, name)
    module = fn.__module__.rpartition(".")[2]
    assert resolve_reward(spelling.format(name=name, module=module)) is fn


def test_trl_reward_names_are_what_the_installed_trl_exports():
    names = set(trl_reward_names())
    # what `trl grpo --reward_funcs` accepts
    assert {
        "accuracy_reward",
        "reasoning_accuracy_reward",
        "think_format_reward",
        "get_soft_overlong_punishment",
    } <= names
    exported = {n for n in trl.rewards.__all__ if callable(getattr(trl.rewards, n))}
    assert names == {n for n in exported if not n.startswith("get_")} | (set(TRL_FACTORY_REWARDS) & exported)
    assert not names & set(REWARD_FUNCS)  # no collision today; test_builtin_name_wins_over_trl_name covers one


@pytest.mark.parametrize(
    "factory, stand_in",
    [
        ("get_soft_overlong_punishment", trl_soft_overlong_punishment),
        ("get_repetition_penalty_reward", trl_repetition_penalty),
        ("get_cosine_scaled_reward", trl_cosine_scaled_reward),
    ],
)
def test_trl_factories_resolve_to_module_level_stand_ins(factory, stand_in):
    assert resolve_reward(factory) is stand_in
    assert resolve_reward(f"trl.rewards.{factory}") is stand_in
    assert resolve_reward(f"trl.rewards:{factory}") is stand_in
    assert reward_name(factory) == factory


def test_trl_factory_stand_ins_score_as_trls_factories():
    ids = [[0] * n for n in (10, 1000, 1200, 1300)]
    # no reward_kwargs: trl grpo's fixed settings for get_soft_overlong_punishment
    assert trl_soft_overlong_punishment(ids) == trl.rewards.get_soft_overlong_punishment(1280, 256)(ids)
    bound = functools.partial(
        resolve_reward("get_soft_overlong_punishment"), max_completion_len=16, soft_punish_cache=8
    )
    assert bound(completion_ids=[[0] * 8, [0] * 14, [0] * 20]) == [0.0, -0.75, -1.0]
    repeats = [[1, 2, 3, 4], [5, 5, 5, 5, 5]]
    assert trl_repetition_penalty(repeats, ngram_size=2) == trl.rewards.get_repetition_penalty_reward(2)(repeats)
    completions = [chat(r"\boxed{\frac{1}{3}}"), chat(r"\boxed{\frac{1}{2}}")]
    scores = trl_cosine_scaled_reward(completions, [r"\frac{1}{3}"] * 2, [[1] * 50] * 2, max_len=100)
    assert scores == pytest.approx([0.75, -0.75])  # TRL's docstring example


def test_builtin_name_wins_over_trl_name(monkeypatch):
    monkeypatch.setitem(REWARD_FUNCS, "accuracy_reward", gsm8k_correctness)
    assert resolve_reward("accuracy_reward") is gsm8k_correctness
    assert resolve_reward("trl.rewards.accuracy_reward") is trl.rewards.accuracy_reward  # explicit path: TRL's


@pytest.mark.parametrize(
    "spelling, name",
    [
        ("gsm8k_correctness", "gsm8k_correctness"),
        ("accuracy_reward", "accuracy_reward"),
        ("trl.rewards.accuracy_reward", "accuracy_reward"),
        ("trl.rewards:accuracy_reward", "accuracy_reward"),
        ("trl.rewards.format_rewards.think_format_reward", "think_format_reward"),
        ("get_soft_overlong_punishment", "get_soft_overlong_punishment"),
        ("my_pkg.rewards.fn", "fn"),
        ("my_pkg.rewards:fn", "fn"),
        ("tests.helpers.reward_plugins:scaled_length", "scaled_length"),
    ],
)
def test_reward_name_is_the_function_name_of_every_spelling(spelling, name):
    assert reward_name(spelling) == name


def test_trl_reward_by_dotted_path_is_named_for_metrics_and_scores():
    funcs = load_reward_funcs(
        RewardArguments(reward_funcs=["trl.rewards.think_format_reward"], reward_isolation=False)
    )
    assert [fn.__name__ for fn in funcs] == ["think_format_reward"]
    assert funcs[0](completions=[chat("<think>plan</think> 4"), chat("4")]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "spelling",
    ["accuracy_reward", "think_format_reward", "trl.rewards.accuracy_reward", "get_soft_overlong_punishment"],
)
def test_trl_reward_resolved_by_name_pickles_by_reference(spelling):
    fn = resolve_reward(spelling)
    blob = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < 200  # a module and a name, not the code
    assert pickle.loads(blob) is fn
    bound = functools.partial(fn, max_completion_len=16)  # as reward_kwargs bind it
    assert pickle.loads(pickle.dumps(bound)).func is fn


# ------------------------------------------------------------------------------------------------ unknown names


@pytest.mark.parametrize(
    "name, first_suggestion",
    [
        ("Accuracy_Reward", "accuracy_reward"),
        ("think_format_rewards", "think_format_reward"),
        ("gsm8k_corectness", "gsm8k_correctness"),
        ("gsm8k", "gsm8k_correctness"),
        ("soft_overlong_punish", "get_soft_overlong_punishment"),
    ],
)
def test_unknown_name_suggests_the_obvious_fix_first_and_lists_both_registries(name, first_suggestion):
    with pytest.raises(RewardLoadError) as info:
        resolve_reward(name)
    message = str(info.value)
    assert f"unknown reward {name!r} (did you mean {first_suggestion!r}" in message
    assert str(sorted(REWARD_FUNCS)) in message
    assert str(sorted(trl_reward_names())) in message
    assert "'module.path:function'" in message and "'module.path.function'" in message


@pytest.mark.parametrize(
    "name, replacement",
    [
        ("accuracy", "use accuracy_reward"),
        ("format", "use r1_zero_format"),
        ("tag_count", "think_format"),
        ("soft_overlong_punishment", "use soft_overlong, or TRL's get_soft_overlong_punishment"),
        ("reasoning_steps", "module.path:function"),
    ],
)
def test_open_r1_reward_names_say_what_to_use_instead(name, replacement):
    """open-r1's recipes name rewards from its own registry; each gets the reward that takes its place."""
    with pytest.raises(RewardLoadError) as info:
        resolve_reward(name)
    assert f"{name!r} is open-r1's name: " in str(info.value) and replacement in str(info.value)


def test_unknown_name_without_a_close_match_still_lists_both_registries():
    with pytest.raises(RewardLoadError) as info:
        resolve_reward("zzz")
    assert "did you mean" not in str(info.value)
    assert "gsm8k_correctness" in str(info.value) and "think_format_reward" in str(info.value)


def test_dotted_path_to_a_missing_function_suggests_the_modules_functions():
    with pytest.raises(RewardLoadError, match="module 'trl.rewards' has no callable 'accuracy_rewrd'") as info:
        resolve_reward("trl.rewards.accuracy_rewrd")
    assert "did you mean 'accuracy_reward'" in str(info.value)
    with pytest.raises(RewardLoadError, match="has no callable 'accuracy_rewards'"):  # a submodule, not a reward
        resolve_reward("trl.rewards.accuracy_rewards")


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """A recipe directory (the working directory) holding a reward module and one that fails to import."""
    (tmp_path / "names_test_rewards.py").write_text(
        "def my_reward(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    (tmp_path / "names_test_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield
    for module in ("names_test_rewards", "names_test_broken"):
        sys.modules.pop(module, None)


@pytest.mark.usefixtures("user_modules")
def test_user_module_resolves_by_dotted_path_and_colon():
    fn = resolve_reward("names_test_rewards.my_reward")
    assert fn is resolve_reward("names_test_rewards:my_reward")
    assert fn(completions=["a", "b"]) == [1.0, 1.0]
    assert pickle.loads(pickle.dumps(fn)) is fn


@pytest.mark.usefixtures("user_modules")
@pytest.mark.parametrize("spelling", ["names_test_broken.fn", "names_test_broken:fn"])
def test_user_module_import_failure_names_the_module(spelling):
    with pytest.raises(RewardLoadError, match=f"cannot import module 'names_test_broken' for '{spelling}'") as info:
        resolve_reward(spelling)
    assert "boom at import" in str(info.value)


@pytest.mark.parametrize("spelling", ["no_such_module_xyz.fn", "no_such_module_xyz:fn", "no_such_pkg_xyz.sub.fn"])
def test_missing_user_module_names_the_module(spelling):
    module = spelling.replace(":", ".").rpartition(".")[0]
    with pytest.raises(RewardLoadError, match=f"cannot import module '{module}'"):
        resolve_reward(spelling)


# ---------------------------------------------------------------------------------------------------- gold by task

GSM8K_GOLDS = [
    (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
    ),
    (
        "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
        "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"
    ),
    (
        "In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\nBetty's grandparents gave her 15 * 2 = "
        "$<<15*2=30>>30.\nThis means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n#### 5"
    ),
]
MATH_GOLDS = [
    "8 + 7 = 15, so Tom has $\\boxed{15}$ apples.",
    (
        "The expression $\\frac{x-3}{4x}$ is equal to zero if and only if the numerator is equal to zero. Thus, "
        "$x-3=0$, so $x=\\boxed{3}$."
    ),
    "We have $\\frac{1}{2} + \\frac{1}{3} = \\frac{3}{6} + \\frac{2}{6} = \\boxed{\\frac{5}{6}}$.",
]
MATH500_ANSWERS = ["\\frac{14}{3}", "\\left( 3, \\frac{\\pi}{2} \\right)", "p - q", "10", "\\text{Evelyn}"]


@pytest.mark.parametrize(
    "gold, expected",
    [
        pytest.param(GSM8K_GOLDS[0], Fraction(72), id="gsm8k"),
        pytest.param("#### 1,000", Fraction(1000), id="gsm8k-thousands"),
        pytest.param("#### -5", Fraction(-5), id="gsm8k-negative"),
        pytest.param("72", Fraction(72), id="bare"),
        pytest.param(" 72.\n", Fraction(72), id="bare-period"),
        pytest.param("$1,234.50", Fraction(2469, 2), id="bare-dollars"),
        pytest.param("-3/4", Fraction(-3, 4), id="bare-fraction"),
        pytest.param("\\frac{3}{4}", Fraction(3, 4), id="bare-latex-fraction"),
        pytest.param("25%", Fraction(25), id="bare-percent"),
        pytest.param("8 + 7 = 15", None, id="worked-line"),  # read as 8 before
        pytest.param(MATH_GOLDS[0], None, id="math-solution"),  # read as 8 before
        pytest.param("\\boxed{15}", None, id="math-boxed"),
        pytest.param("The answer is 15", None, id="prose"),
        pytest.param("#### 8 + 7 = 15", None, id="gsm8k-tail-not-a-number"),
        pytest.param("#### eight", None, id="gsm8k-tail-word"),
        pytest.param("", None, id="empty"),
    ],
)
def test_gsm8k_gold_reads_only_gsm8k_shaped_gold(gold, expected):
    assert gsm8k_gold(gold) == expected


def test_gsm8k_grading_refuses_a_math_style_gold_instead_of_reading_its_first_number():
    # the issue: gold "8 + 7 = 15" graded against 8, so a completion ending in "8" scored 1.0
    with pytest.raises(ValueError, match="not GSM8K gold"):
        grade("#### 8", "8 + 7 = 15", "gsm8k")
    with pytest.raises(ValueError, match="not GSM8K gold"):
        gsm8k_correctness(["gibberish 8"], solution=[MATH_GOLDS[0]])
    assert gsm8k_correctness(["so #### 15"], solution=["8 + 7 = 15\n#### 15"]) == [1.0]


@pytest.mark.parametrize(
    "gold, gsm8k, math",
    [
        (GSM8K_GOLDS[0], True, False),
        (MATH_GOLDS[1], False, True),
        ("72", True, True),
        ("\\frac{14}{3}", True, True),
        ("p - q", False, True),
        ("8 + 7 = 15", False, True),
        ("", False, False),
    ],
)
def test_fits_task(gold, gsm8k, math):
    assert (fits_task(gold, "gsm8k"), fits_task(gold, "math")) == (gsm8k, math)


def test_check_gold_format_names_math_for_math_golds_in_a_gsm8k_task():
    golds = [MATH_GOLDS[i % 3] for i in range(120)] + [GSM8K_GOLDS[i % 3] for i in range(80)]
    assert check_gold_format("gsm8k", golds) == (
        "120 of 200 sampled gold answers do not parse as gsm8k gold ('#### N' or a number); "
        "they look like math (\\boxed{...})"
    )


def test_check_gold_format_names_gsm8k_for_gsm8k_golds_in_a_math_task():
    message = check_gold_format("math", GSM8K_GOLDS * 10)
    assert message == (
        "30 of 30 sampled gold answers do not parse as math gold (\\boxed{...} or a short answer); "
        "they look like gsm8k ('#### N')"
    )


def test_check_gold_format_on_the_arithmetic_data():
    problems = make_split("train", 100, seed=0)
    answers = [p["answer"] for p in problems]  # "3 + 4 = 7\n#### 7": the preset's solution_column
    solutions = [p["solution"] for p in problems]  # "7"
    assert check_gold_format("gsm8k", answers) is None
    assert check_gold_format("gsm8k", solutions) is None
    assert check_gold_format("math", solutions) is None  # bare numbers are MATH answers too
    assert check_gold_format("math", answers).startswith("100 of 100 sampled gold answers do not parse as math gold")
    assert check_gold_format("math", answers).endswith("they look like gsm8k ('#### N')")
    worked_lines = [a.splitlines()[0] for a in answers]  # "3 + 4 = 7", the gold
    message = check_gold_format("gsm8k", worked_lines)
    assert message.startswith("100 of 100 sampled gold answers do not parse as gsm8k gold")
    assert f"neither gsm8k ('#### N') nor math (\\boxed{{...}}) (first: {worked_lines[0]!r})" in message


def test_check_gold_format_is_quiet_on_matching_golds():
    assert check_gold_format("gsm8k", GSM8K_GOLDS * 5 + ["72", "$1,234"]) is None
    assert check_gold_format("math", MATH_GOLDS * 5 + MATH500_ANSWERS) is None
    assert check_gold_format("math", []) is None


def test_check_gold_format_warns_from_a_fifth_of_misfits():
    assert check_gold_format("gsm8k", ["#### 1"] * 9 + [MATH_GOLDS[0]]) is None  # 10%
    message = check_gold_format("gsm8k", ["#### 1"] * 8 + MATH_GOLDS[:2])  # 20%
    assert message.startswith("2 of 10 sampled gold answers")
    assert check_gold_format("gsm8k", ["#### 1"] * 8 + MATH_GOLDS[:2], threshold=0.5) is None


def test_check_gold_format_refuses_an_unknown_task():
    with pytest.raises(ValueError, match="unknown task 'aime'"):
        check_gold_format("aime", ["#### 1"])
