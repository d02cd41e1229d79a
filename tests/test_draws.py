"""The inverse-CDF draw that replaces ``torch.multinomial`` in the trainer's generation on a CPU
(hf_grpo/generation/draws.py): the same law as torch's, torch's own path for whatever it does not cover, and the
trainer's generation really goes through it."""

from __future__ import annotations

import pytest
import torch

from hf_grpo.generation import draws

from .helpers.trainers import make_trainer


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    seen = expected > 0
    return float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())


def test_draws_follow_the_distribution_and_never_a_zero_entry():
    """4 rows of 50 entries (some zero, one tiny) drawn 40k times each: counts fit the probabilities (chi-square far
    below the 1e-6 tail of 49 degrees of freedom, ~110), as torch.multinomial's do; a zero entry is never drawn."""
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, 50, generator=generator) * 2, -1)  # [4, 50]
    probs[:, [0, 7, 49]] = 0  # first, middle and last entries impossible
    probs[:, 1] = 1e-4
    probs /= probs.sum(-1, keepdim=True)
    draws_n, stats = 40_000, {}
    for name, draw in (("ours", draws.draw_one), ("torch", torch.multinomial)):
        torch.manual_seed(1)
        samples = torch.cat([draw(probs, 1) for _ in range(draws_n)], dim=1)  # [4, draws_n]
        assert samples.dtype == torch.int64 and samples.shape == (4, draws_n)
        counts = torch.stack([torch.bincount(row, minlength=50) for row in samples]).double()  # [4, 50]
        assert counts[:, [0, 7, 49]].sum() == 0, name
        stats[name] = max(_chi_square(counts[r], probs[r].double()) for r in range(4))
    assert stats["ours"] < 110 and stats["torch"] < 110, stats


def test_what_it_does_not_cover_goes_to_torch():
    probs = torch.tensor([[0.2, 0.8, 0.0], [0.5, 0.5, 0.0]])
    torch.manual_seed(2)
    several = draws.draw_one(probs, 2, replacement=True)
    torch.manual_seed(2)
    assert torch.equal(several, torch.multinomial(probs, 2, replacement=True))  # several samples: torch's draw
    with pytest.raises(RuntimeError, match="probability tensor"):  # a bad row: torch's own error
        draws.draw_one(torch.tensor([[0.5, -0.1, 0.6]]), 1)


def test_the_trainers_generation_draws_one_uniform_per_row_and_puts_torch_back(tmp_path, monkeypatch):
    """One training step: HF generate's sampling calls went through ``draw_one`` (one call per decode step, all the
    rows at once), and ``torch.multinomial`` is torch's again afterwards."""
    calls = []
    original = draws.draw_one

    def spy(input, num_samples, *args, **kwargs):
        calls.append(tuple(input.shape))
        return original(input, num_samples, *args, **kwargs)

    monkeypatch.setattr(draws, "draw_one", spy)  # the swap reads draws.draw_one when the block starts
    trainer = make_trainer(tmp_path, max_steps=1, max_completion_length=6)
    trainer.train()
    assert torch.multinomial is draws._MULTINOMIAL
    rows = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert calls and all(shape[0] == rows for shape in calls), calls
    assert len(calls) <= trainer.args.max_completion_length
