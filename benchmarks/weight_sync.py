"""Weight sync per optimizer step, trainer -> vLLM server: bytes and seconds, ``lora`` (adapter only) vs ``full``.

    python benchmarks/weight_sync.py                  # 20 timed syncs per path after 3 warm-ups (~15 s on 2 cores)
    python benchmarks/weight_sync.py --repeats 5      # a quick look

What it measures, and how (every number printed says which kind it is):

1. MEASURED, wall clock (``time.perf_counter``), on the tiny Qwen2 of ``hf_grpo.models.tiny`` built with hidden size 128
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

The formulas, their checks and the computed rows are in ``benchmarks/weight_sync_formulas.py``, the three measured
paths in ``benchmarks/weight_sync_measure.py``; this script holds the command line and the report.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from weight_sync_formulas import BANDWIDTHS, check_formulas, computed_syncs, model_full_bytes
from weight_sync_measure import measure_tiny


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------------------------------------------------------------
# Helpers


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
# The run and its report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    stack = import_stack()  # after argument parsing

    from hf_grpo.models.tiny import build_model, build_tokenizer

    logging_off()
    print_machine(args, stack)

    tokenizer = build_tokenizer()
    base = build_model(tokenizer, hidden_size=args.hidden)
    base_names = {name for name, _ in base.named_parameters()}
    tiny_params = sum(p.numel() for p in base.parameters())  # before PEFT adds its LoRA tensors to the same modules

    section("formula check (parameter counts; must match exactly)")
    rows, ok = check_formulas(base, args.rank)
    table(["count", "checked against", "formula", "actual", ""], rows)
    if not ok:
        print("FORMULA CHECK FAILED")
        return 1

    lora, full_trl, full_copy = measure_tiny(base, tokenizer, base_names, args)
    report_measured(args, tiny_params, lora, full_trl, full_copy)
    computed = computed_syncs(args.rank)
    report_computed(args, computed)
    report_summary(lora, full_trl, full_copy, computed)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\ntotal runtime {time.perf_counter() - started:.1f} s; load average at end: {load}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed syncs per path")
    parser.add_argument("--warmup", type=int, default=3, help="untimed syncs first")
    parser.add_argument("--hidden", type=int, default=128, help="tiny model hidden size")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    return parser.parse_args(argv)


def import_stack() -> SimpleNamespace:
    """torch, transformers, peft, TRL and safetensors, imported here so that --help stays light."""
    import peft
    import safetensors
    import torch
    import transformers
    import trl

    return SimpleNamespace(peft=peft, safetensors=safetensors, torch=torch, transformers=transformers, trl=trl)


def print_machine(args: argparse.Namespace, stack: SimpleNamespace) -> None:
    section("machine")
    print(f"{platform.platform()} | {platform.processor() or platform.machine()} | os.cpu_count()={os.cpu_count()}")
    print(
        f"python {platform.python_version()} | torch {stack.torch.__version__} "
        f"({stack.torch.get_num_threads()} threads) | transformers {stack.transformers.__version__} | "
        f"peft {stack.peft.__version__} | trl {stack.trl.__version__} | safetensors {stack.safetensors.__version__}"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1/5/15 min) at start: {load}; timings are wall clock, so other load on the machine shows up")
    print(f"N = {args.repeats} timed repetitions per measured path, after {args.warmup} untimed warm-ups")


def report_measured(args: argparse.Namespace, tiny_params: int, lora: dict, full_trl: dict, full_copy: dict) -> None:
    """What each measured path ran, its bytes and seconds per part, and the fixture's HTTP floor."""
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
    rows = part_rows("lora (real path)", lora["file_bytes"], lora["samples"])
    median, low = stats(lora["floor"])
    rows.append(["  fixture HTTP floor, 1 request", "", "404 POST", fmt_s(median), fmt_s(low)])
    rows += part_rows("full (a) TRL iterator, stand-in", full_trl["payload_bytes"], full_trl["samples"])
    rows += part_rows("full (b) copy+merge_and_unload", full_copy["payload_bytes"], full_copy["samples"])
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


def part_rows(label: str, nbytes: int, samples: dict[str, list[float]]) -> list[list[str]]:
    """One table row per timed part of a path: the label on the first, the bytes on the total's."""
    rows = []
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
    return rows


def report_computed(args: argparse.Namespace, computed: list[tuple[str, int, int]]) -> None:
    """The Qwen2.5 syncs by formula: bytes and bytes / each assumed bandwidth."""
    section(f"COMPUTED (not measured): Qwen2.5 bf16, LoRA r={args.rank}; time = bytes / bandwidth")
    table(
        ["what is sent", "params", "bytes", "full/this", *[name for name, _ in BANDWIDTHS]],
        [
            [
                label,
                f"{n:,}",
                fmt_bytes(b),
                f"{model_full_bytes(label) / b:.0f}x",
                *[fmt_s(b / bw) for _, bw in BANDWIDTHS],
            ]
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


def report_summary(lora: dict, full_trl: dict, full_copy: dict, computed: list[tuple[str, int, int]]) -> None:
    """One line per sync, measured and computed, bytes and seconds side by side."""
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
