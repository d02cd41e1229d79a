"""How a generation's rows are cut into micro-batches (hf_grpo/training/micro_batches.py): regrouped into whole groups only
within an optimizer step, and dynamic sampling's fill rows weighing nothing, however TRL's shuffle fell."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

from hf_grpo.training import micro_batches


G, GROUPS, FILLED = 4, 8, 2  # rows per group, groups per generation, of which fill groups


def generation(rows_per_prompt: int = G) -> dict:
    """A generation batch as dynamic sampling hands it to TRL: groups side by side, the fill groups last."""
    rows = G * GROUPS
    prompts = torch.arange(GROUPS).repeat_interleave(rows_per_prompt)[:rows, None].repeat(1, 3)  # [R, P]
    filled = torch.arange(rows) >= rows - FILLED * G  # [R]
    return {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_mask": (~filled)[:, None].long().repeat(1, 5),  # [R, C]
        "advantages": torch.randn(rows),
        "filled": filled,
        "num_items_in_batch": torch.tensor(5 * (rows - FILLED * G)),
    }


@pytest.mark.parametrize(("steps_per_generation", "accumulation"), [(4, 4), (4, 2), (2, 4), (4, 3)])
def test_fill_rows_weigh_nothing_and_groups_move_only_within_an_optimizer_step(steps_per_generation, accumulation):
    """Over 300 of TRL's shuffles, the real rows of every optimizer step weigh 1 in a loss that averages over rows
    (before, regrouped fill groups filled whole micro-batches, which still counted: 0.75 at worst), unless a window
    of one micro-batch holds only fill rows; each micro-batch holds only rows TRL's shuffle put in its optimizer
    step; and where the window is the whole generation, whole groups."""
    size = micro_batches.window(steps_per_generation, accumulation)
    torch.manual_seed(0)
    for _ in range(300):
        batches = split_tensor_dict(shuffle_sequence_dict(generation()), steps_per_generation)
        arranged = micro_batches.arrange(batches, size, regroup=True, row_mean=True)
        rows = batches[0]["advantages"].numel()
        weights = [
            float((~b["filled"]).sum()) / rows * float(b.get("fill_scale", 1.0)) / accumulation for b in arranged
        ]
        for start in range(0, len(arranged), size):  # a window's real rows: its share of the optimizer step
            real = any((~b["filled"]).any() for b in arranged[start : start + size])  # (none: a window of fill rows)
            assert sum(weights[start : start + size]) == pytest.approx(size / accumulation * real, abs=1e-6)
            before = torch.cat([b["advantages"] for b in batches[start : start + size]])
            after = torch.cat([b["advantages"] for b in arranged[start : start + size]])
            assert torch.equal(before.sort().values, after.sort().values)  # the same rows, moved within the window
        if size == steps_per_generation:  # the window is the whole generation
            for b in arranged:  # whole groups: each prompt's rows all in one micro-batch
                prompts = b["prompt_ids"][:, 0]
                assert all(int((prompts == p).sum()) == G for p in prompts.unique())


def test_without_regrouping_the_order_stays_and_only_the_weights_change():
    torch.manual_seed(1)
    batches = split_tensor_dict(shuffle_sequence_dict(generation()), 4)
    arranged = micro_batches.arrange(batches, 4, regroup=False, row_mean=True)
    for before, after in zip(batches, arranged, strict=True):
        assert torch.equal(before["advantages"], after["advantages"])
        assert float(after["fill_scale"]) == pytest.approx(GROUPS / (GROUPS - FILLED))
    assert "fill_scale" not in micro_batches.arrange(batches, 4, regroup=False, row_mean=False)[0]
