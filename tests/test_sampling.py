"""Dynamic sampling's bookkeeping on hand-made tensors: keep mask, group split/collate, pool, fill, prompt stream."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest
import torch

from hf_grpo.training import dynamic_sampling as sampling
from hf_grpo.training.dynamic_sampling import (
    GroupPool,
    PromptStream,
    assemble_batch,
    collate_groups,
    keep_mask,
    split_groups,
)
from hf_grpo.training.trainer import leave_one_out_advantages

from .helpers.common import tiny_config


NAN = float("nan")


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [False, False, False]),  # all zero
        ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [False, False, False]),  # all one
        ([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], [True, False, False]),
        ([0.5, 0.5 + 1e-9, 0.2, 0.3, NAN, NAN], [False, True, False]),  # float noise is not variance; NaN = no info
        ([NAN, 1.0, 0.0, NAN, 1.0, 1.0], [False, False, False]),  # one finite value per group is not enough
        ([0.0, 1.1, 0.0, 0.0, 0.05, 0.0], [True, False, True]),  # shaped rewards
    ],
)
def test_keep_mask(rewards, expected):
    assert keep_mask(torch.tensor(rewards), 2).tolist() == expected


def test_keep_mask_groups_of_four():
    rewards = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float)
    assert keep_mask(rewards, 4).tolist() == [True, False, False]


def batch_of(prompt_lens, completion_lens, advantages, pad=0):
    """A scored batch as TRL returns it: prompts left-padded, completions right-padded."""
    rows = len(prompt_lens)
    p, c = max(prompt_lens), max(completion_lens)
    out = {
        "prompt_ids": torch.full((rows, p), pad),
        "prompt_mask": torch.zeros(rows, p, dtype=torch.long),
        "completion_ids": torch.full((rows, c), pad),
        "completion_mask": torch.zeros(rows, c, dtype=torch.long),
        "advantages": torch.tensor(advantages, dtype=torch.float),
        "num_items_in_batch": torch.tensor(99),
    }
    for i, (pl, cl) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        out["prompt_ids"][i, p - pl :] = torch.arange(1, pl + 1) + 100 * i
        out["prompt_mask"][i, p - pl :] = 1
        out["completion_ids"][i, :cl] = torch.arange(1, cl + 1) + 100 * i
        out["completion_mask"][i, :cl] = 1
    return out


def test_split_then_collate_across_rounds_repads_both_sides():
    round1 = batch_of([3, 3, 2, 2], [2, 4, 1, 1], [1.0, -1.0, 0.5, -0.5])
    round2 = batch_of([5, 5], [6, 3], [0.7, -0.7], pad=0)
    groups = split_groups(round1, 2) + split_groups(round2, 2)
    assert len(groups) == 3 and all(g["completion_ids"].size(0) == 2 for g in groups)
    batch = collate_groups([groups[2], groups[0]], pad_token_id=0)
    assert batch["prompt_ids"].shape == (4, 5) and batch["completion_ids"].shape == (4, 6)
    # prompts stay right-aligned (left padding), completions left-aligned (right padding)
    assert batch["prompt_mask"][2].tolist() == [0, 0, 1, 1, 1]
    assert batch["prompt_ids"][2, 2:].tolist() == [1, 2, 3]
    assert batch["completion_mask"][3].tolist() == [1, 1, 1, 1, 0, 0]
    assert batch["advantages"].tolist() == pytest.approx([0.7, -0.7, 1.0, -1.0])
    assert "num_items_in_batch" not in batch  # recomputed by the trainer for the assembled batch


def test_collate_names_a_key_that_only_a_later_group_has():
    """The key check looked at the first group's keys only, so a key of later groups was dropped."""
    first, second = split_groups(batch_of([2, 2, 2, 2], [1, 1, 1, 1], [1.0, -1.0, 1.0, -1.0]), 2)
    second["policy_version"] = torch.tensor([3, 3])
    with pytest.raises(ValueError, match=r"\['policy_version'\] present in some groups only"):
        collate_groups([first, second], pad_token_id=0)


def test_overlapped_carried_groups_resume_without_overlap(tmp_path):
    """Groups carried by an overlapped run hold ``policy_version``; resumed with overlap off they are
    collated with fresh groups (which have none) instead of crashing the first step."""
    carried = split_groups(batch_of([2, 2], [1, 1], [1.0, -1.0]), 2)
    carried[0]["policy_version"] = torch.tensor([4, 4])
    sampling.save_state(str(tmp_path), 0, PromptStream(size=10, seed=0), GroupPool(carried), "digest")
    fresh = split_groups(batch_of([3, 3], [2, 2], [0.5, -0.5]), 2)
    overlapped = sampling.load_state(str(tmp_path), 0, PromptStream(size=10, seed=0), "cpu", overlap=True)
    assert overlapped.groups[0]["policy_version"].tolist() == [4, 4]  # an overlapped resume keeps the versions
    pool = sampling.load_state(str(tmp_path), 0, PromptStream(size=10, seed=0), "cpu", overlap=False)
    batch = collate_groups(pool.groups + fresh, pad_token_id=0)
    assert "policy_version" not in batch and batch["advantages"].tolist() == [1.0, -1.0, 0.5, -0.5]


def test_split_refuses_multimodal_batches():
    batch = batch_of([2, 2], [1, 1], [0.0, 0.0])
    batch["pixel_values"] = torch.zeros(2, 3)
    with pytest.raises(NotImplementedError, match="pixel_values"):
        split_groups(batch, 2)


def test_pool_is_first_in_first_out_and_survives_a_round_trip():
    groups = [{"completion_ids": torch.full((2, i + 1), i)} for i in range(3)]
    pool = GroupPool()
    pool.add(groups)
    assert [g["completion_ids"][0, 0].item() for g in pool.take(2)] == [0, 1]
    assert len(pool) == 1
    restored = GroupPool.from_state_tensors(pool.state_tensors(), device="cpu")
    assert torch.equal(restored.groups[0]["completion_ids"], groups[2]["completion_ids"])


def group(tag: float) -> dict:
    return {"advantages": torch.tensor([tag, -tag])}


def test_assemble_takes_kept_groups_oldest_first_and_carries_the_rest():
    pool = GroupPool([group(1), group(2), group(3)])
    chosen, filled = assemble_batch(pool, dropped=[group(0)], needed=2)
    assert [g["advantages"][0].item() for g in chosen] == [1, 2] and filled == 0
    assert [g["advantages"][0].item() for g in pool.groups] == [3]  # carried to the next step


def test_assemble_fills_an_exhausted_budget_with_the_latest_dropped_groups():
    pool = GroupPool([group(1)])
    dropped = [group(0.0), group(-0.0), group(0.0)]
    chosen, filled = assemble_batch(pool, dropped, needed=3)
    assert filled == 2 and len(chosen) == 3 and len(pool) == 0
    assert chosen[1] is dropped[1] and chosen[2] is dropped[2]


def test_assemble_all_dropped():
    chosen, filled = assemble_batch(GroupPool(), [group(0.0)] * 4, needed=4)
    assert filled == 4 and len(chosen) == 4


def test_prompt_stream_is_deterministic_and_resumable():
    a = PromptStream(size=10, seed=3)
    first = a.next(7) + a.next(7)  # crosses an epoch boundary
    assert sorted(first[:10]) == list(range(10))
    b = PromptStream(size=10, seed=3)
    b.next(7)
    c = PromptStream(size=10, seed=3, **b.state())
    assert c.next(7) == first[7:]


def test_leave_one_out_with_nan_and_scaling():
    rewards = torch.tensor([1.0, 0.0, NAN, 1.0, 1.0, 0.0, 0.0, 0.0])
    adv = leave_one_out_advantages(rewards, 4, "none")
    # group 1: valid {1, 0, 1}: baselines (0+1)/2, (1+1)/2, (1+0)/2
    assert adv[:4].tolist() == pytest.approx([0.5, -1.0, 0.0, 0.5])
    assert adv[4:].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    scaled = leave_one_out_advantages(rewards, 4, "group")
    assert scaled[4].item() == pytest.approx(1.0 / (torch.tensor([1.0, 0, 0, 0]).std().item() + 1e-4))


def test_doctests():
    assert doctest.testmod(sampling).failed == 0


def test_under_overlap_the_trim_keeps_the_groups_the_next_step_can_use():
    """The surplus of an overlapped step holds round-1 groups of the previous policy (version 4) and
    fresh round-2 groups (version 5); at the next step ``drop_older`` discards version 4 (max_staleness 1), so the
    trim must keep the version-5 groups, not the version-4 ones."""

    def pool() -> GroupPool:
        return GroupPool([{"policy_version": torch.tensor([v, v]), "tag": torch.tensor([i])} for i, v in
                          enumerate([4, 4, 5, 5])])  # fmt: skip

    overlapped = pool()
    assert overlapped.trim(2, keep_newest=True) == 2
    assert overlapped.drop_older(5) == 0 and [int(g["tag"]) for g in overlapped.groups] == [2, 3]
    synchronous = pool()  # without overlap the trim keeps the oldest (first in, first out): 2 would be lost here
    assert synchronous.trim(2) == 2 and synchronous.drop_older(5) == 2


def test_trimmed_pools_stay_within_one_step_on_sixteen_processes():
    """16 processes needing 2 groups each, keep rate 0.5, rounds until the
    process with the fewest kept groups has enough (at most 8). Untrimmed, the pools grew to about 100 groups with
    waits of dozens of steps; trimmed after each step, no pool holds more than one step's worth and no group waits
    more than one step."""
    gen = torch.Generator().manual_seed(0)
    processes, needed, per_round, max_rounds = 16, 2, 2, 8
    pools = [GroupPool() for _ in range(processes)]
    untrimmed = [GroupPool() for _ in range(processes)]
    longest_wait, largest_pool, largest_untrimmed = 0, 0, 0
    for step in range(1000):
        for these, trim in ((pools, True), (untrimmed, False)):
            for _ in range(max_rounds):
                for pool in these:
                    kept = torch.rand(per_round, generator=gen) < 0.5
                    pool.add([{"born": torch.tensor(step)} for k in kept if k])
                if min(len(p) for p in these) >= needed:
                    break
            for pool in these:
                groups, _ = assemble_batch(pool, [{"born": torch.tensor(step)}] * needed, needed)
                if trim:
                    longest_wait = max([longest_wait] + [step - int(g["born"]) for g in groups])
                    pool.trim(needed)
                    largest_pool = max(largest_pool, len(pool))
                else:
                    largest_untrimmed = max(largest_untrimmed, len(pool))
    assert largest_pool <= needed and longest_wait <= 1
    assert largest_untrimmed > 10 * needed  # what the trim prevents


@pytest.mark.parametrize(("scale", "warned"), [("batch", True), ("group", False), ("none", False)])
def test_batch_scaled_rewards_with_dynamic_sampling_say_which_std_scales_a_kept_group(tmp_path, caplog, scale, warned):
    """A kept group's advantages come from its own round; under ``scale_rewards:
    batch`` that round's std includes the groups dynamic sampling dropped. Said at configuration time."""
    tiny_config(tmp_path, dynamic_sampling=True, scale_rewards=scale)
    assert ("scale_rewards 'batch': each kept group's advantages" in caplog.text) is warned


def test_a_process_with_fewer_groups_to_fill_pads_with_copies_that_collate():
    """Every process runs as many old-log-prob forward passes as the one with the most groups to fill (a collective
    under ZeRO-3), padding with copies of its first batch group. That group may be a carried one, which already has
    its old log-probs: the copies must not bring them, or the padded batch cannot be collated (seen in a 2-process
    run: "cannot collate groups: ['old_per_token_logps'] present in some groups only")."""
    accelerator = SimpleNamespace(
        device="cpu", process_index=0, num_processes=2, gather=lambda t: torch.cat([t, t + 1])
    )
    sampler = sampling.DynamicSampler(
        accelerator, [{"prompt": "q"}] * 4, 2, seed=0, max_rounds=2, exhausted="fill", pad_token_id=0
    )
    fresh = {
        "prompt_ids": torch.ones(2, 3, dtype=torch.long),
        "prompt_mask": torch.ones(2, 3, dtype=torch.long),
        "completion_ids": torch.ones(2, 4, dtype=torch.long),
        "completion_mask": torch.ones(2, 4, dtype=torch.long),
        "advantages": torch.zeros(2),
    }
    carried = {**fresh, "old_per_token_logps": torch.zeros(2, 4)}
    passes = []

    def old_logps(batch):  # [rows, C]: row i holds i
        passes.append(batch["completion_ids"].size(0))
        return torch.arange(batch["completion_ids"].size(0), dtype=torch.float).unsqueeze(1).expand(-1, 4)

    sampler._fill_old_logps([fresh], carried, old_logps, ())
    assert passes == [4]  # this process's group and one copy: the other process (gathered count 2) fills two
    assert fresh["old_per_token_logps"].tolist() == [[0.0] * 4, [1.0] * 4]
