"""A reward may return what TRL accepts (a list, a 1-D numpy array or tensor, of numbers, bools,
numpy scalars or None), isolated or not, with the values of the equivalent Python list; anything else (a string, a
dict, a 2-D array, the wrong length) gives no reward, counted as an error, with its type named in one warning."""

from __future__ import annotations

import logging

import pytest

from hf_grpo.rewards import RewardArguments, load_reward_funcs
from hf_grpo.rewards.functions import gsm8k_correctness
from hf_grpo.rewards.wrapper import IsolatedReward, RewardFailedError
from tests.helpers import reward_plugins


PLUGINS = "tests.helpers.reward_plugins:"
COMPLETIONS = ["a", "bb", "ccc", "dddd", "eeeee"]
# (reward, the Python-list reward it must equal)
ACCEPTED = [
    ("as_numpy_bools", "as_bools"),
    ("as_numpy_float32s", "as_list"),
    ("as_numpy_array", "as_list"),
    ("as_tensor", "as_list"),
    ("as_bools", "as_bools"),
]
# (reward, what the warning names)
REFUSED = [
    ("as_2d_array", "2-D ndarray"),
    ("as_string", "str"),
    ("as_dict", "dict"),
    ("one_too_many", "2 rewards for 1 completion"),
]
NAMES = sorted({n for pair in ACCEPTED for n in pair} | {n for n, _ in REFUSED})


def call(fn, completions=COMPLETIONS, metrics=None):
    """Call ``fn`` the way TRL's ``_calculate_rewards`` does."""
    log = metrics.__setitem__ if metrics is not None else lambda name, value: None
    return fn(
        prompts=["p"] * len(completions),
        completions=completions,
        completion_ids=[[1]] * len(completions),
        log_metric=log,
        log_extra=lambda column, values: None,
    )


@pytest.fixture(scope="module")
def isolated():
    args = RewardArguments(reward_funcs=[PLUGINS + n for n in NAMES], reward_workers=2, reward_timeout=120)
    funcs = load_reward_funcs(args)  # the timeout: a worker's first ``import torch`` (as_tensor) takes seconds
    yield dict(zip(NAMES, funcs, strict=True))
    funcs[0].pool.close()


def in_process():
    funcs = load_reward_funcs(RewardArguments(reward_funcs=[PLUGINS + n for n in NAMES], reward_isolation=False))
    return dict(zip(NAMES, funcs, strict=True))


@pytest.fixture(params=["isolated", "in_process"])
def rewards(request):
    return request.getfixturevalue("isolated") if request.param == "isolated" else in_process()


@pytest.mark.parametrize(("name", "reference"), ACCEPTED)
def test_what_trl_accepts_is_accepted(name, reference, rewards):
    expected = [float(v) for v in getattr(reward_plugins, reference)(COMPLETIONS)]
    metrics = {}
    got = call(rewards[name], metrics=metrics)
    assert got == pytest.approx(expected) and all(type(v) is float for v in got), got
    assert metrics[f"rewards/{name}/errors"] == 0.0


@pytest.mark.parametrize(("name", "named"), REFUSED)
def test_what_trl_refuses_is_an_error_named_once(name, named, rewards, caplog):
    if name == "one_too_many" and not isinstance(rewards[name], IsolatedReward):
        named = "6 rewards for 5 completions"
    with caplog.at_level(logging.WARNING, logger="hf_grpo.rewards.wrapper"):
        metrics = {}
        assert call(rewards[name], metrics=metrics) == [None] * len(COMPLETIONS)
        assert metrics[f"rewards/{name}/errors"] == len(COMPLETIONS)
        if named != "6 rewards for 5 completions":  # the same mistake on another batch: the same message
            assert call(rewards[name], completions=["x", "yy"]) == [None, None]
    warnings = [r.getMessage() for r in caplog.records if f"reward {name!r} failed" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once, not once per completion or per call
    assert named in warnings[0] and "must return a list" in warnings[0], warnings[0]


def test_a_reward_that_always_returns_a_wrong_type_stops_the_run_in_process():
    reward = in_process()["as_dict"]
    for _ in range(2):
        assert call(reward) == [None] * len(COMPLETIONS)
    with pytest.raises(RewardFailedError, match=r"reward 'as_dict' returned what TRL cannot use .*got a dict"):
        call(reward)


def test_built_in_and_async_rewards_are_not_wrapped_in_process():
    funcs = load_reward_funcs(
        RewardArguments(reward_funcs=["gsm8k_correctness", PLUGINS + "async_reward"], reward_isolation=False)
    )
    assert funcs[0] is gsm8k_correctness and funcs[1] is reward_plugins.async_reward
