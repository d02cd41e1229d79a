"""Weight sync per optimizer step, trainer -> vLLM server: bytes and seconds, ``lora`` (adapter only) vs ``full``.

    python benchmarks/weight_sync.py                  # 20 timed syncs per path after 3 warm-ups (~15 s on 2 cores)
    python benchmarks/weight_sync.py --repeats 5      # a quick look

What it measures, and how (every number printed says which kind it is):

1. MEASURED, wall clock (``time.perf_counter``), on the tiny Qwen2 of ``hf_grpo.tiny`` built with hidden size 128
   (fp32, 2 layers) plus PEFT LoRA r=16 on q/k/v/o; ``--repeats`` timed syncs per path after ``--warmup`` untimed
   ones; median and min reported.

   - ``lora``: the real code path. ``ServerGenerator.sync`` (hf_grpo/generation/server_generator.py) is called on a
     trainer-like object, so it runs ``save_adapter`` (``get_peft_model_state_dict`` -> safetensors file + adapter
     config + sha256 of the file) and then ``POST /v1/load_lora_adapter`` under a new name and
     ``POST /v1/unload_lora_adapter`` of the previous one, against the fixture server
     (tests/helpers/fake_vllm_server.py over hf_grpo/vllm_standin, real HTTP on 127.0.0.1, in a thread of this process). The client's load and
     unload calls are wrapped with timers, so total = write + load + unload. Before each sync the LoRA weights are
     perturbed (a stand-in for an optimizer step), so every sync ships a different adapter; the server's sha256 of
     the last adapter is checked against the trainer's. Bytes: size of ``adapter_model.safetensors``.
     Caveats: the fixture server builds the adapter by deep-copying its base and merging (CPU), which vLLM does not
     do (it copies the LoRA tensors into its GPU LoRA slots), and each of its answers that has a body costs a fixed
     ~44 ms on loopback (measured and printed as "fixture HTTP floor"), so "load" and "unload" are the fixture's
     costs, not vLLM's.
   - ``full``: a CPU STAND-IN for TRL's full sync (``VLLMGeneration.sync_weights`` in server mode, TRL 1.16), whose
     NCCL transfer needs CUDA and cannot run here. Two variants:
     (a) TRL's own iterator ``VLLMGeneration._iter_named_params`` (called unbound on a stand-in object, no
         FSDP/ZeRO): ``merge_adapter()``, every base parameter under its vLLM name (LoRA tensors skipped, tied
         weights once), ``unmerge_adapter()``; each yielded tensor is serialized with ``safetensors.torch.save``
         into memory where TRL would pack it into the NCCL broadcast;
     (b) a copy: ``copy.deepcopy(peft_model).merge_and_unload()``, then every parameter serialized in memory with
         ``safetensors.torch.save``.
     Bytes: sum of numel x element size of every tensor the server would receive (what the broadcast moves).

2. COMPUTED (not measured) for the real Qwen2.5-1.5B and Qwen2.5-7B configs, LoRA r=16 on q/k/v/o, bf16 weights:
   parameter counts from closed formulas (below), checked first against (i) the tiny model's ``sum(p.numel())``,
   (ii) PEFT adapters actually instantiated on tiny Qwen2 models (tied and untied, q/k/v/o and all-linear) and
   (iii) both Qwen2.5 configs instantiated on the meta device with and without PEFT; any mismatch exits 1.
   Transfer times = bytes / an assumed bandwidth (stated in the table), not measured.

Formulas (h = hidden_size, I = intermediate_size, L = num_hidden_layers, V = vocab_size, d = h / num_attention_heads,
kv = num_key_value_heads * d, r = LoRA rank):
    full  = V*h*(1 if tied else 2) + h + L * (h*h + h  +  2*(h*kv + kv)  +  h*h  +  3*h*I  +  2*h)
            (embed [+ lm_head], final norm; per layer q with bias, k and v with bias, o without, gate/up/down, 2 norms)
    lora  = L * sum over targets of r * (in + out)   (A is r x in, B is out x r)
            q: (h, h), k: (h, kv), v: (h, kv), o: (h, h), gate/up: (h, I), down: (I, h)
    bytes = params x element size (bf16 2, fp32 4); 1 GB = 1e9 bytes; a safetensors file adds a JSON header.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

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


# ---------------------------------------------------------------------------------------------------------------------
# Helpers


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{int(n)} B"


def fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print(line)
    for row in rows:
        print(
            "  ".join(
                str(x).ljust(w) if i == 0 else str(x).rjust(w)
                for i, (x, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def stats(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), min(samples)


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 110 - len(title)))


# ---------------------------------------------------------------------------------------------------------------------
# Formula checks


def check_formulas(tiny_model, rank: int) -> bool:
    """The closed formulas must reproduce real module counts exactly; prints one line per check."""
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

    tiny = Arch.from_config(f"tiny (hf_grpo.tiny, h={tiny_model.config.hidden_size}, tied)", tiny_model.config)
    record(
        f"full  {tiny.name}",
        "sum(p.numel()) of the model",
        full_params(tiny),
        sum(p.numel() for p in tiny_model.parameters()),
    )
    for targets, label in ((QKVO, "q/k/v/o"), (ALL_LINEAR, "all-linear")):
        actual = adapter_numel(copy.deepcopy(tiny_model), targets)
        record(
            f"lora  {tiny.name} r={rank} {label}", "PEFT adapter state dict", lora_params(tiny, rank, targets), actual
        )

    torch.manual_seed(0)
    untied = Arch("tiny untied (h=96, 3 layers, 6/3 heads)", 96, 200, 3, 6, 3, 300, tied=False)
    model = Qwen2ForCausalLM(untied.to_config())
    record(
        f"full  {untied.name}",
        "sum(p.numel()) of the model",
        full_params(untied),
        sum(p.numel() for p in model.parameters()),
    )
    for targets, label in ((QKVO, "q/k/v/o"), (ALL_LINEAR, "all-linear")):
        actual = adapter_numel(copy.deepcopy(model), targets)
        record(
            f"lora  {untied.name} r={rank} {label}",
            "PEFT adapter state dict",
            lora_params(untied, rank, targets),
            actual,
        )

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
    table(["count", "checked against", "formula", "actual", ""], rows)
    return ok


# ---------------------------------------------------------------------------------------------------------------------
# Measurements on the tiny model


def measure_lora(peft_model, model_dir: Path, work: Path, rank: int, warmup: int, repeats: int) -> dict:
    """The real ``ServerGenerator.sync`` against the fixture server in a thread."""
    import torch

    from hf_grpo.generation.server_generator import ADAPTER_FILE, ServerGenerator
    from tests.helpers.fake_vllm_server import start_in_thread  # the stand-in with its test routes

    accelerator = SimpleNamespace(unwrap_model=lambda m: m, is_main_process=True, wait_for_everyone=lambda: None)
    trainer = SimpleNamespace(
        model=peft_model, accelerator=accelerator, is_deepspeed_enabled=False, state=SimpleNamespace(global_step=0)
    )
    lora = [p for name, p in peft_model.named_parameters() if "lora_" in name]
    server = start_in_thread(model_dir, enable_lora=True, max_lora_rank=rank, allow_runtime_lora_updating=True)
    with server, contextlib.ExitStack() as cleanup:
        generator = ServerGenerator(server.url, work / "adapters")
        # Close the client's keep-alive connection before the server stops, so the server's handler thread ends: a
        # daemon thread still alive at interpreter exit aborted this script now and then ("terminate called without
        # an active exception", exit 134).
        cleanup.callback(generator.client.close)
        generator.connect(trainer)
        timers = {"load": 0.0, "unload": 0.0}

        def timed(kind, fn):
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    timers[kind] += time.perf_counter() - start

            return wrapper

        generator.client.load_lora_adapter = timed("load", generator.client.load_lora_adapter)
        generator.client.unload_lora_adapter = timed("unload", generator.client.unload_lora_adapter)
        samples = {"write": [], "load": [], "unload": [], "total": []}
        for step in range(1, warmup + repeats + 1):
            with torch.no_grad():  # stand-in for an optimizer step: every sync ships a different adapter
                for p in lora:
                    p.add_(torch.randn_like(p), alpha=1e-3)
            trainer.state.global_step = step
            timers["load"] = timers["unload"] = 0.0
            start = time.perf_counter()
            synced = generator.sync(trainer)
            total = time.perf_counter() - start
            assert synced
            if step > warmup:
                samples["total"].append(total)
                samples["load"].append(timers["load"])
                samples["unload"].append(timers["unload"])
                samples["write"].append(total - timers["load"] - timers["unload"])
        floor = []  # the fixture's per-request cost: POST that does nothing but answer 404 with a JSON body
        for _ in range(warmup + repeats):
            start = time.perf_counter()
            response = generator.client.session.post(
                f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "no-such-adapter"}, timeout=30
            )
            floor.append(time.perf_counter() - start)
            assert response.status_code == 404
        served = generator.client.session.get(f"{server.url}/fixture/adapters", timeout=30).json()["adapters"]
        assert list(served) == [generator.adapter_name], served
        assert served[generator.adapter_name]["sha256"] == generator.adapter_sha256
        file = work / "adapters" / f"step-{trainer.state.global_step}" / ADAPTER_FILE
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model)
    return {
        "samples": samples,
        "floor": floor[warmup:],
        "file_bytes": file.stat().st_size,
        "tensor_bytes": tensor_bytes(state.values()),
        "tensors": len(state),
        "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
        "check": f"server serves only {generator.adapter_name}, its sha256 = the trainer's file's "
        f"({generator.adapter_sha256[:12]})",
    }


def measure_full_trl(peft_model, base_names: set[str], warmup: int, repeats: int) -> dict:
    """TRL's ``_iter_named_params`` (merge, every base param under its vLLM name, unmerge), serialized in memory."""
    from safetensors.torch import save
    from trl.generation.vllm_generation import VLLMGeneration

    stand_in = SimpleNamespace(
        model=peft_model, _dist=SimpleNamespace(gather_params=lambda params: contextlib.nullcontext(), is_fsdp=False)
    )
    stand_in._fix_param_name_to_vllm = functools.partial(VLLMGeneration._fix_param_name_to_vllm, stand_in)
    samples = {"merge+unmerge": [], "serialize": [], "total": []}
    names, payload, serialized = [], 0, 0
    for rep in range(warmup + repeats):
        names, payload, serialized, t_serialize = [], 0, 0, 0.0
        start = time.perf_counter()
        params = VLLMGeneration._iter_named_params(stand_in)
        item = next(params)  # runs merge_adapter()
        t_merge = time.perf_counter() - start
        while True:
            name, tensor = item
            t0 = time.perf_counter()
            blob = save({name: tensor.contiguous()})  # where TRL packs the tensor into the NCCL broadcast
            t_serialize += time.perf_counter() - t0
            names.append(name)
            payload += tensor.numel() * tensor.element_size()
            serialized += len(blob)
            t0 = time.perf_counter()
            try:
                item = next(params)
            except StopIteration:  # the last step runs unmerge_adapter()
                t_merge += time.perf_counter() - t0
                break
        total = time.perf_counter() - start
        if rep >= warmup:
            samples["merge+unmerge"].append(t_merge)
            samples["serialize"].append(t_serialize)
            samples["total"].append(total)
    assert set(names) == base_names and len(names) == len(base_names), sorted(set(names) ^ base_names)[:5]
    return {
        "samples": samples,
        "payload_bytes": payload,
        "serialized_bytes": serialized,
        "tensors": len(names),
        "check": f"the {len(names)} names sent = the base model's named_parameters() (LoRA skipped, tied once)",
    }


def measure_full_copy(peft_model, warmup: int, repeats: int) -> dict:
    """``deepcopy(peft_model).merge_and_unload()``, then all parameters as one safetensors blob in memory."""
    from safetensors.torch import save

    samples = {"copy+merge": [], "serialize": [], "total": []}
    payload = serialized = 0
    for rep in range(warmup + repeats):
        start = time.perf_counter()
        merged = copy.deepcopy(peft_model).merge_and_unload()
        t_merge = time.perf_counter() - start
        state = {name: p.detach().contiguous() for name, p in merged.named_parameters()}
        blob = save(state)
        total = time.perf_counter() - start
        payload, serialized = tensor_bytes(state.values()), len(blob)
        if rep >= warmup:
            samples["copy+merge"].append(t_merge)
            samples["serialize"].append(total - t_merge)
            samples["total"].append(total)
    return {"samples": samples, "payload_bytes": payload, "serialized_bytes": serialized, "tensors": len(state)}


# ---------------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed syncs per path")
    parser.add_argument("--warmup", type=int, default=3, help="untimed syncs first")
    parser.add_argument("--hidden", type=int, default=128, help="tiny model hidden size")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import peft
    import safetensors
    import torch
    import transformers
    import trl
    from peft import LoraConfig, get_peft_model

    from hf_grpo.tiny import build_model, build_tokenizer

    logging_off()
    section("machine")
    print(f"{platform.platform()} | {platform.processor() or platform.machine()} | os.cpu_count()={os.cpu_count()}")
    print(
        f"python {platform.python_version()} | torch {torch.__version__} ({torch.get_num_threads()} threads) | "
        f"transformers {transformers.__version__} | peft {peft.__version__} | trl {trl.__version__} | "
        f"safetensors {safetensors.__version__}"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1/5/15 min) at start: {load}; timings are wall clock, so other load on the machine shows up")
    print(f"N = {args.repeats} timed repetitions per measured path, after {args.warmup} untimed warm-ups")

    tokenizer = build_tokenizer()
    base = build_model(tokenizer, hidden_size=args.hidden)
    base_names = {name for name, _ in base.named_parameters()}
    tiny_params = sum(p.numel() for p in base.parameters())

    section("formula check (parameter counts; must match exactly)")
    if not check_formulas(base, args.rank):
        print("FORMULA CHECK FAILED")
        return 1

    with tempfile.TemporaryDirectory(prefix="weight-sync-") as tmp:
        work = Path(tmp)
        base.save_pretrained(work / "model")
        tokenizer.save_pretrained(work / "model")
        torch.manual_seed(1)
        peft_model = get_peft_model(
            base, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=QKVO)
        )
        with torch.no_grad():  # a trained-looking adapter (B is zero at init, which would make merging trivial)
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.02)
        lora = measure_lora(peft_model, work / "model", work, args.rank, args.warmup, args.repeats)
        full_trl = measure_full_trl(peft_model, base_names, args.warmup, args.repeats)
        full_copy = measure_full_copy(peft_model, args.warmup, args.repeats)

    section(f"measured: tiny Qwen2 (h={args.hidden}, {tiny_params:,} params, fp32), LoRA r={args.rank} q/k/v/o")
    print(
        f"lora: ServerGenerator.sync -> save_adapter + POST /v1/load_lora_adapter (+ unload of the previous) into the "
        f"fixture server in-thread;\n      {lora['tensors']} tensors, {lora['dtype']}; check: {lora['check']}"
    )
    print(
        f"full (a): TRL VLLMGeneration._iter_named_params (merge_adapter, all params, unmerge_adapter), each tensor "
        f"safetensors.torch.save'd in memory;\n      CPU STAND-IN for TRL's merge + NCCL broadcast (not run: needs "
        f"CUDA); check: {full_trl['check']}"
    )
    print(
        "full (b): deepcopy(peft model).merge_and_unload() + safetensors.torch.save(all params) in memory; "
        "CPU STAND-IN as (a)"
    )
    rows = []

    def add(label: str, nbytes: int, samples: dict[str, list[float]]) -> None:
        for part, values in samples.items():
            median, low = stats(values)
            rows.append(
                [
                    label if part == next(iter(samples)) else "",
                    fmt_bytes(nbytes) if part == "total" else "",
                    part,
                    fmt_s(median),
                    fmt_s(low),
                ]
            )

    add("lora (real path)", lora["file_bytes"], lora["samples"])
    median, low = stats(lora["floor"])
    rows.append(["  fixture HTTP floor, 1 request", "", "404 POST", fmt_s(median), fmt_s(low)])
    add("full (a) TRL iterator, stand-in", full_trl["payload_bytes"], full_trl["samples"])
    add("full (b) copy+merge_and_unload", full_copy["payload_bytes"], full_copy["samples"])
    table(["path", "bytes/sync", "part", "median", "min"], rows)
    print(
        f"bytes: lora = adapter_model.safetensors file size ({lora['tensor_bytes']:,} B tensors + "
        f"{lora['file_bytes'] - lora['tensor_bytes']:,} B header); full = sum(numel x element size) of the "
        f"{full_trl['tensors']} tensors sent ({full_trl['serialized_bytes']:,} B as per-tensor safetensors blobs). "
        f"full/lora payload = {full_trl['payload_bytes'] / lora['tensor_bytes']:.1f}x"
    )
    floor = statistics.median(lora["floor"])
    work_s = statistics.median(lora["samples"]["total"]) - 2 * floor
    print(
        f"fixture HTTP floor: a POST that only answers 404 takes {fmt_s(floor)} median (GET /health, whose response "
        "has no body, is ~1 ms), likely\nNagle + delayed ACK: the fixture's http.server sends headers and body in two "
        f"writes. The lora sync makes 2 such requests; total minus 2 floors = {fmt_s(work_s)}\n(write + the fixture's "
        "deepcopy-and-merge on load). vLLM's server is a different stack; its latency is not measured here."
    )

    section(f"COMPUTED (not measured): Qwen2.5 bf16, LoRA r={args.rank}; time = bytes / bandwidth")
    computed = []
    for arch in (QWEN25_1_5B, QWEN25_7B):
        n_full, n_lora = full_params(arch), lora_params(arch, args.rank, QKVO)
        computed.append((f"{arch.name} full bf16", n_full, 2 * n_full))
        computed.append((f"{arch.name} lora q/k/v/o bf16", n_lora, 2 * n_lora))
        computed.append((f"{arch.name} lora q/k/v/o fp32", n_lora, 4 * n_lora))
    n7 = lora_params(QWEN25_7B, 8, ALL_LINEAR)
    computed.append(("Qwen2.5-7B lora r=8 all-linear fp32 *", n7, 4 * n7))
    table(
        ["what is sent", "params", "bytes", "full/this", *[name for name, _ in BANDWIDTHS]],
        [
            [label, f"{n:,}", fmt_bytes(b), f"{_full_bytes(label) / b:.0f}x", *[fmt_s(b / bw) for _, bw in BANDWIDTHS]]
            for label, n, b in computed
        ],
    )
    print(
        "full/this = the model's full bf16 bytes / this row's bytes. Adapter rows are tensor bytes; the file adds a "
        "small JSON header.\nAdapter dtype: PEFT upcasts LoRA to fp32 on a bf16 base (autocast_adapter_dtype=True), "
        "so save_adapter writes fp32 in TRL 1.16's default setup;\nTRL keeps it bf16 under ZeRO-3 "
        "(autocast_adapter_dtype=False) and casts it to bf16 for QLoRA.\n"
        "* the repo's shipped 7B recipes (qwen7b-lora-*.yaml) use r=8 on all-linear; shown for reference.\n"
        "Bandwidths are assumptions (effective, one direction). A full sync also merges and unmerges on the trainer "
        "and loads into vLLM; an adapter sync also\nreads the file and loads it into vLLM's LoRA slots; neither is in "
        "these numbers."
    )

    section("summary")
    summary = []
    for label, data, nbytes in (
        ("lora, tiny (real path)", lora, lora["file_bytes"]),
        ("full, tiny (a) TRL iterator", full_trl, full_trl["payload_bytes"]),
        ("full, tiny (b) copy+merge", full_copy, full_copy["payload_bytes"]),
    ):
        median, low = stats(data["samples"]["total"])
        how = "measured, CPU" + ("" if label.startswith("lora") else " stand-in")
        summary.append([label, how, fmt_bytes(nbytes), f"median {fmt_s(median)}, min {fmt_s(low)}"])
    for label, _, b in computed:
        if "all-linear" in label:
            continue
        times = f"{fmt_s(b / 150e9)} @150 GB/s .. {fmt_s(b / 12e9)} @12 GB/s"
        summary.append([label, "computed: bytes/bw", fmt_bytes(b), times])
    table(["sync", "how", "bytes/sync", "seconds per sync"], summary)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\ntotal runtime {time.perf_counter() - started:.1f} s; load average at end: {load}")
    return 0


def _full_bytes(label: str) -> int:
    arch = QWEN25_1_5B if label.startswith(QWEN25_1_5B.name) else QWEN25_7B
    return 2 * full_params(arch)


def logging_off() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("hf_grpo.vllm_standin.server").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
