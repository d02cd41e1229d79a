"""hf_grpo.training.prompt_selection: the reward history that decides which prompts to skip before generating them."""

from __future__ import annotations

import itertools
import json

import pytest

from hf_grpo.training.prompt_selection import PromptHistory, prompt_key


def test_the_skip_probability_rises_with_the_streak_and_never_reaches_one():
    history = PromptHistory(explore_start=0.5, max_skip=0.95)
    assert history.skip_probability(7) == 0.0  # never generated: always generated now
    seen = []
    for step in range(1, 8):
        history.record(1, signal=False, value=0.0, step=step)  # all wrong, again and again
        seen.append(history.skip_probability(1))
    assert seen[:3] == [0.5, 0.75, 0.875]  # 1 - 0.5 ** streak
    assert all(a <= b for a, b in itertools.pairwise(seen)) and max(seen) == 0.95  # capped: it comes back


def test_a_group_with_a_signal_ends_the_streak_and_the_kind_follows_the_last_group():
    history = PromptHistory()
    history.record(1, signal=False, value=1.0, step=1)
    assert history.records[1].kind == "solved" and history.records[1].streak == 1
    history.record(1, signal=True, value=0.0, step=2)
    assert history.records[1].streak == 0 and history.skip_probability(1) == 0.0
    history.record(1, signal=False, value=0.0, step=3)  # all wrong: nothing learned from it either
    assert history.records[1].kind == "failed"


def test_every_process_decides_the_same_and_each_step_draws_anew():
    a, b = PromptHistory(seed=3), PromptHistory(seed=3)
    keys = list(range(400))
    for history in (a, b):  # the same gathered outcomes on both
        for key in keys:
            history.record(key, signal=key % 2 == 0, value=0.0, step=1)
    assert a.keep(keys, step=2, round_index=0) == b.keep(keys, step=2, round_index=0)
    assert a.keep(keys, step=2, round_index=0) != a.keep(keys, step=3, round_index=0)
    kept = a.keep(keys, step=2, round_index=0)
    assert all(kept[0::2])  # a prompt whose last group had a signal is always generated
    assert 0.4 < 1 - sum(kept[1::2]) / 200 < 0.6  # one empty group: skipped about half the time


def test_the_exploration_adapts_toward_the_target_kept_share_within_bounds():
    history = PromptHistory(target_kept=0.6, explore_start=0.5, rate=0.1, explore_floor=0.2)
    history.adapt(kept_fraction=0.3)  # wasted too much: skip more
    assert history.explore == {"solved": pytest.approx(0.4), "failed": pytest.approx(0.4)}
    for _ in range(10):
        history.adapt(kept_fraction=0.1)
    assert history.explore["failed"] == pytest.approx(0.2)  # the floor
    for _ in range(20):
        history.adapt(kept_fraction=0.9)
    assert history.explore["solved"] == 1.0  # kept more than asked: no skipping at all


def test_a_resumed_history_decides_exactly_as_the_uninterrupted_one():
    history = PromptHistory(seed=1)
    for step in range(1, 4):
        for i in range(50):
            history.record(i, signal=i % 5 == 0, value=float(i % 3 == 0), step=step)
        history.adapt(kept_fraction=0.2)
    resumed = PromptHistory(seed=1)
    resumed.load_state_dict(json.loads(json.dumps(history.state_dict())))  # through a checkpoint's JSON
    keys = list(range(60))
    assert resumed.keep(keys, step=4, round_index=1) == history.keep(keys, step=4, round_index=1)
    assert resumed.stats() == history.stats()


@pytest.mark.parametrize(("name", "value"), [("target_kept", 0.0), ("explore_start", 1.5), ("max_skip", 1.0)])
def test_bad_settings_name_the_setting(name, value):
    with pytest.raises(ValueError, match=name):
        PromptHistory(**{name: value})


def test_the_key_of_a_prompt_is_its_text_or_its_messages():
    assert prompt_key("2 + 2?") == prompt_key("2 + 2?") != prompt_key("2 + 3?")
    chat = [{"role": "user", "content": "2 + 2?"}]
    assert prompt_key(chat) == prompt_key([dict(m) for m in chat]) != prompt_key("2 + 2?")
