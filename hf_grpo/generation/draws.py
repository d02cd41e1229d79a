"""One token per row drawn by inverse CDF: HF generate's sampling step on a CPU without its cost.

HF generate samples each decode step with ``torch.multinomial(probs, 1)``, which on a CPU draws one exponential per
vocabulary entry (argmax of p / q, q ~ Exp(1)): 32 rows x 49k entries for SmolLM2 is 36 ms a step on 2 cores, 14 %
of the real-model recipe's generation. The inverse CDF draws the same distribution from one uniform per row: the
row's cumulative sums (float64), then the first entry whose sum passes ``u * total``: about 1 ms.

``one_uniform_per_row`` swaps it in for ``torch.multinomial`` while a block runs (``hf_grpo.GRPOTrainer._generate``);
every call it does not cover (several samples, ``out=``, another device than the CPU, a distribution torch would
refuse) goes to torch's own. The samples differ from torch's draw for draw (other random numbers), not in law.
"""

from __future__ import annotations

import contextlib

import torch


_MULTINOMIAL = torch.multinomial


def draw_one(input, num_samples, replacement=False, *, generator=None, out=None):
    """``torch.multinomial``'s signature; one sample per row of a 2-D CPU ``input`` by inverse CDF."""
    if num_samples != 1 or out is not None or input.dim() != 2 or input.device.type != "cpu" or input.size(1) == 0:
        return _MULTINOMIAL(input, num_samples, replacement, generator=generator, out=out)
    cdf = input.to(torch.float64).cumsum(-1)  # [R, V]
    total = cdf[:, -1:]  # [R, 1]
    if not (torch.isfinite(total).all() and (total > 0).all() and (input >= 0).all()):
        return _MULTINOMIAL(input, num_samples, replacement, generator=generator, out=out)  # torch's error
    u = torch.rand(total.shape, dtype=torch.float64, generator=generator) * total  # [R, 1] in [0, total)
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # rounding never reaches the total
    return torch.searchsorted(cdf, u, right=True)  # [R, 1]: first entry whose sum exceeds u (never a zero entry)


@contextlib.contextmanager
def one_uniform_per_row():
    """``torch.multinomial`` is ``draw_one`` inside the block (another thread's calls too: the same law)."""
    torch.multinomial = draw_one
    try:
        yield
    finally:
        torch.multinomial = _MULTINOMIAL
