"""The three measured sync paths of ``benchmarks/weight_sync.py``, on the tiny model with a LoRA adapter.

``measure_lora`` runs the real ``ServerGenerator.sync`` against the fixture server; ``measure_full_trl`` and
``measure_full_copy`` are the CPU stand-ins for TRL's full sync; ``measure_tiny`` builds the adapter and runs all
three. What each one times, and its caveats, is in ``benchmarks/weight_sync.py``'s docstring; run that script:

    python benchmarks/weight_sync.py --repeats 5

The heavy imports (torch, PEFT, TRL, the fixture server from ``tests/helpers``) are done inside the functions, once
the script has put the repository on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from weight_sync_formulas import QKVO


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_tiny(base, tokenizer, base_names: set[str], args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """The three measured paths on ``base`` with a LoRA adapter: (lora, full (a) TRL iterator, full (b) copy)."""
    import torch
    from peft import LoraConfig, get_peft_model

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
    return lora, full_trl, full_copy


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
