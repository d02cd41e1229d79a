"""What bounds a GRPO step on this machine: the matmul FLOP/s and memory bandwidth measured here, and the FLOPs and
bytes a step's training and generation must execute, counted from the model's shapes and the step's token counts.

Used by ``benchmarks/real_model_speed.py``, which prints each phase's ratio to its limit; on its own it prints the two
measured limits:

    python benchmarks/limits.py

Training (one optimizer step): every linear layer of the backbone runs forward once per token it sees, and backward
once more to pass the gradient to its input (frozen weights: no weight gradient, LoRA's is counted separately), a
third time when activation checkpointing recomputes the forward. Attention adds 4 x context x hidden per token and
layer. The LM head projects each scored position onto the vocabulary three times (forward, the kernel's recompute in
backward, the input gradient). Which tokens are seen and which positions scored depends on the path:

- TRL's (on a CPU): every row's prompt + completion, every position scored;
- shared prompts (hf_grpo/training/shared_prompts.py): each distinct prompt but its last token once, then every row's last
  prompt token + completion, only those positions scored (TRL's head on them: the completion's and one more).

Generation (one HF generate call): each decode step reads every weight once and each row's KV cache so far; the
bytes over the read bandwidth bound it from below, and so do its FLOPs over the matmul FLOP/s (at 32 rows the FLOPs
bind: 2 x 135M x 32 per step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def matmul_flops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """The fp32 matmul FLOP/s ``threads`` torch threads reach here (an n x n product, best of ``repeats``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(before)
    return 2 * n**3 / best


def read_bandwidth(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s a sum over a ``mib`` MiB float32 tensor reads here (best of ``repeats``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    x = torch.rand(mib * 2**20 // 4)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(before)
    return x.numel() * 4 / best


@dataclass(frozen=True)
class Shapes:
    """The sizes of a decoder-only model that its FLOPs and bytes follow from."""

    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # key/value heads x head size
    vocab: int
    params: int  # every parameter (the bytes a decode step reads)
    lora_rank: int = 0  # on every linear layer of the backbone, 0 without LoRA

    @classmethod
    def of(cls, config, params: int, lora_rank: int = 0) -> Shapes:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv = getattr(config, "num_key_value_heads", heads) * head_dim
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size, kv, config.vocab_size,
                   params, lora_rank)  # fmt: skip

    def linear_flops(self) -> float:
        """Forward FLOPs per token of the backbone's linear layers (q, k, v, o, gate, up, down), all layers."""
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        per_layer = 2 * (h * h + 2 * h * kv + h * h + 3 * h * i)
        lora = 2 * self.lora_rank * (2 * h + 2 * (h + kv) + 2 * h + 2 * (h + i) + (i + h)) if self.lora_rank else 0
        return self.layers * (per_layer + lora)

    def attention_flops(self, context: float) -> float:
        """Forward FLOPs per token of attention over ``context`` earlier tokens, all layers."""
        return self.layers * 4 * context * self.hidden


def train_flops(shapes: Shapes, rows: int, prompt: int, completion: int, groups: int, shared: bool, recompute: bool):
    """FLOPs one optimizer step's training executes: ``rows`` completions of ``groups`` distinct prompts, padded to
    ``prompt`` + ``completion`` tokens (as TRL pads a generation batch)."""
    if shared:
        seen = [(groups * (prompt - 1), prompt / 2), (rows * (1 + completion), prompt + completion / 2)]
        scored = rows * (1 + completion)  # TRL's head on the suffix: the last position predicts nothing
    else:
        seen = [(rows * (prompt + completion), (prompt + completion) / 2)]
        scored = rows * (prompt + completion - 1)
    forward = sum(tokens * (shapes.linear_flops() + shapes.attention_flops(context)) for tokens, context in seen)
    head = 2 * shapes.hidden * shapes.vocab * scored
    return forward * (3 if recompute else 2) + 3 * head


def decode_cost(shapes: Shapes, rows: int, prompt: int, steps: int) -> tuple[float, float]:
    """(bytes read, FLOPs) of ``steps`` decode steps of ``rows`` rows after a ``prompt``-token prompt, in float32."""
    kv_bytes = sum(rows * shapes.layers * 2 * shapes.kv_width * (prompt + t) * 4 for t in range(steps))
    per_token = shapes.linear_flops() + 2 * shapes.hidden * shapes.vocab
    flops = sum(rows * (per_token + shapes.attention_flops(prompt + t)) for t in range(steps))
    return steps * shapes.params * 4 + kv_bytes, flops


def ratios(steps: list[dict], peak: dict) -> dict:
    """Each phase against its limit (benchmarks/limits.py), over ``steps``: training's executed FLOP/s over the
    measured matmul FLOP/s; generation's lower bounds (bytes over the read bandwidth, FLOPs over the matmul FLOP/s)
    over its seconds."""
    train, gen = sum(s["train"] for s in steps), sum(s["generate"] for s in steps)
    flops, read, gen_flops = (sum(s[k] for s in steps) for k in ("train_flops", "gen_bytes", "gen_flops"))
    return {
        "matmul_gflops": peak["matmul"] / 1e9,
        "bandwidth_gbs": peak["bandwidth"] / 1e9,
        "train_tflop_step": flops / len(steps) / 1e12,
        "train_limit": flops / train / peak["matmul"],
        "gen_bandwidth_limit": read / peak["bandwidth"] / gen,
        "gen_compute_limit": gen_flops / peak["matmul"] / gen,
    }


def describe(r: dict) -> str:
    """One line: an arm's table row (``ratios`` merged in) against its limits."""
    return (
        f"{r['arm']}: training {r['train_tflop_step']:.2f} TFLOP/step executed at "
        f"{r['train_tflop_step'] * 1e3 / r['train']:.1f} GFLOP/s = {r['train_limit']:.0%} of the {r['matmul_gflops']:.0f} "
        f"GFLOP/s matmul peak; generation at {r['gen_bandwidth_limit']:.0%} of its bandwidth bound "
        f"({r['bandwidth_gbs']:.1f} GB/s) and {r['gen_compute_limit']:.0%} of its FLOP bound"
    )


if __name__ == "__main__":
    import torch

    threads = torch.get_num_threads()
    print(f"matmul {matmul_flops(threads) / 1e9:.1f} GFLOP/s and read bandwidth {read_bandwidth(threads) / 1e9:.1f} "
          f"GB/s with {threads} torch threads")  # fmt: skip
