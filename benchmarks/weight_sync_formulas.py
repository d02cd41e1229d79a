"""Parameter and byte counts of a weight sync by closed formula, for ``benchmarks/weight_sync.py``'s COMPUTED rows.

The formulas (see ``benchmarks/weight_sync.py``'s docstring) for a full sync and a LoRA adapter of a Qwen2
architecture; ``check_formulas`` checks them against real modules (the tiny model, PEFT adapters on tiny Qwen2
models, and both Qwen2.5 configs on the meta device); ``computed_syncs`` gives the rows the script prints. No
measurement here: run ``python benchmarks/weight_sync.py``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass


QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = QKVO + ["gate_proj", "up_proj", "down_proj"]

# Assumed effective bandwidths for the computed transfer times, bytes per second (1 GB = 1e9 bytes).
BANDWIDTHS = [
    ("NVLink ~150 GB/s", 150e9),
    ("PCIe5 x16 ~50 GB/s", 50e9),
    ("100Gb/s net ~12 GB/s", 12e9),
    ("NVMe write ~3 GB/s", 3e9),
]


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @classmethod
    def from_config(cls, name: str, config) -> Arch:
        return cls(
            name,
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.vocab_size,
            bool(config.tie_word_embeddings),
        )

    def to_config(self):
        from transformers import Qwen2Config

        return Qwen2Config(
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            vocab_size=self.vocab,
            tie_word_embeddings=self.tied,
        )


# Source: the config.json of Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-7B on the Hugging Face hub (Qwen2ForCausalLM;
# Qwen2 has biases on q/k/v only). Written out here because this machine has no hub access.
QWEN25_1_5B = Arch("Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 151936, tied=True)
QWEN25_7B = Arch("Qwen2.5-7B", 3584, 18944, 28, 28, 4, 152064, tied=False)


def full_params(a: Arch) -> int:
    """Every parameter the server receives in a full sync (tied embeddings counted once)."""
    h, kv = a.hidden, a.kv_dim
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * a.intermediate + 2 * h
    return a.vocab * h * (1 if a.tied else 2) + h + a.layers * per_layer


def lora_params(a: Arch, r: int, targets: list[str]) -> int:
    """LoRA A (r x in) + B (out x r) for each target module of every layer."""
    h, kv, inter = a.hidden, a.kv_dim, a.intermediate
    in_out = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    return a.layers * sum(r * (in_out[t][0] + in_out[t][1]) for t in targets)


def check_formulas(tiny_model, rank: int) -> tuple[list[list[str]], bool]:
    """The closed formulas must reproduce real module counts exactly: (one table row per check, all matched)."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import Qwen2ForCausalLM

    def adapter_numel(model, targets) -> int:
        peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
        return sum(t.numel() for t in get_peft_model_state_dict(peft_model).values())

    rows, ok = [], True

    def record(what: str, source: str, formula: int, actual: int) -> None:
        nonlocal ok
        ok &= formula == actual
        rows.append([what, source, f"{formula:,}", f"{actual:,}", "OK" if formula == actual else "MISMATCH"])

    def check_built(arch: Arch, model) -> None:  # the formulas against a built model and its PEFT adapters
        record(
            f"full  {arch.name}",
            "sum(p.numel()) of the model",
            full_params(arch),
            sum(p.numel() for p in model.parameters()),
        )
        for targets, label in ((QKVO, "q/k/v/o"), (ALL_LINEAR, "all-linear")):
            actual = adapter_numel(copy.deepcopy(model), targets)
            record(
                f"lora  {arch.name} r={rank} {label}",
                "PEFT adapter state dict",
                lora_params(arch, rank, targets),
                actual,
            )

    check_built(
        Arch.from_config(f"tiny (hf_grpo.models.tiny, h={tiny_model.config.hidden_size}, tied)", tiny_model.config),
        tiny_model,
    )
    torch.manual_seed(0)
    untied = Arch("tiny untied (h=96, 3 layers, 6/3 heads)", 96, 200, 3, 6, 3, 300, tied=False)
    check_built(untied, Qwen2ForCausalLM(untied.to_config()))

    for arch in (QWEN25_1_5B, QWEN25_7B):
        with torch.device("meta"):
            model = Qwen2ForCausalLM(arch.to_config())
        record(
            f"full  {arch.name}",
            "meta-device model, sum(numel)",
            full_params(arch),
            sum(p.numel() for p in model.parameters()),
        )
        record(
            f"lora  {arch.name} r={rank} q/k/v/o",
            "meta-device PEFT adapter",
            lora_params(arch, rank, QKVO),
            adapter_numel(model, QKVO),
        )
    return rows, ok


def model_full_bytes(label: str) -> int:
    """Full bf16 bytes of the Qwen2.5 model a ``computed_syncs`` label names."""
    arch = QWEN25_1_5B if label.startswith(QWEN25_1_5B.name) else QWEN25_7B
    return 2 * full_params(arch)


def computed_syncs(rank: int) -> list[tuple[str, int, int]]:
    """(what is sent, parameters, bytes) per sync of the Qwen2.5 models: full bf16, and LoRA r=``rank`` on q/k/v/o."""
    computed = []
    for arch in (QWEN25_1_5B, QWEN25_7B):
        n_full, n_lora = full_params(arch), lora_params(arch, rank, QKVO)
        computed.append((f"{arch.name} full bf16", n_full, 2 * n_full))
        computed.append((f"{arch.name} lora q/k/v/o bf16", n_lora, 2 * n_lora))
        computed.append((f"{arch.name} lora q/k/v/o fp32", n_lora, 4 * n_lora))
    n7 = lora_params(QWEN25_7B, 8, ALL_LINEAR)
    computed.append(("Qwen2.5-7B lora r=8 all-linear fp32 *", n7, 4 * n7))
    return computed
