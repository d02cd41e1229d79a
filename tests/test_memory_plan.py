"""The memory plan (hf_grpo.launch.memory_plan, hf_grpo.recipe.memory): its activation formula against what autograd
really saves, the ZeRO arithmetic, a plan and a verdict for every shipped recipe without any download, and a recipe
that cannot fit refused with exit 2 before anything loads, in one line naming the largest term and a fix."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from hf_grpo.launch import memory_plan as mp
from hf_grpo.launch.hardware import Machine
from hf_grpo.recipe import load_recipe, memory
from hf_grpo.recipe.schema import RecipeError
from hf_grpo.train import main

from .helpers.common import REPO


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
GPU_RECIPES = [r for r in RECIPES if r.name.startswith("qwen")]


def saved_bytes(config: LlamaConfig, rows: int, seq: int, padded: bool) -> int:
    """Bytes autograd keeps for the backward of one LoRA forward through the decoder layers (weights excluded)."""
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules="all-linear"))
    ids = torch.randint(0, config.vocab_size, (rows, seq))
    mask = torch.ones_like(ids)
    if padded:
        mask[: rows // 2, :5] = 0  # left padding on half the rows
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.base_model.model.model(input_ids=ids, attention_mask=mask)  # the layers, not the LM head
    return sum(saved.values())


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "left padding"])
def test_the_activation_formula_matches_what_autograd_saves(padded):
    config = LlamaConfig(hidden_size=96, intermediate_size=256, num_hidden_layers=3, num_attention_heads=6,
                         num_key_value_heads=2, vocab_size=500, tie_word_embeddings=True)  # fmt: skip
    shape = mp.shape_from_config(config, "test", "a test config")
    rows, seq = 4, 40
    measured = saved_bytes(config, rows, seq, padded)
    planned = rows * seq * shape.layers * shape.saved_per_token() * 4
    assert abs(planned / measured - 1) < 0.15, (planned, measured)
    exact = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert shape.params == exact
    lora = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules="all-linear"))
    assert shape.lora_params(4, "all-linear") == sum(p.numel() for p in lora.parameters() if p.requires_grad)


def settings(**changes) -> mp.Settings:
    base = dict(
        dtype="bfloat16", mixed_precision=True, use_peft=False, lora_r=16, lora_targets="all-linear",
        lora_dropout=0.0, load_in_4bit=False, processes=8, zero_stage=3, fsdp=False, offload_optimizer=False,
        beta=0.0, per_device_batch=1, generation_batch=1, eval_batch=0, prompt_tokens=10, eval_prompt_tokens=10,
        completion_tokens=10,
        eval_completion_tokens=10, activation_checkpointing=True, warm_start_batch=0, generation="hf",
    )  # fmt: skip
    return mp.Settings(**{**base, **changes})


def test_zero_stages_shard_the_sixteen_bytes_of_a_mixed_precision_parameter():
    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                         vocab_size=1000)  # fmt: skip
    shape = mp.shape_from_config(config, "test", "a test config")
    p = shape.params

    def held(**changes) -> dict[str, int]:
        device, host = mp.training_terms(shape, settings(**changes))
        return {t.name.split(" (")[0]: t.nbytes for t in [*device, *host]}

    stage3 = held(zero_stage=3)  # bf16 weights and gradients, fp32 master + 2 moments: 2 + 2 + 12 bytes, all / 8
    assert stage3 == {"trainable weights": 2 * p // 8, "gradients": 2 * p // 8, "optimizer states": 12 * p // 8}
    stage2 = held(zero_stage=2)
    assert stage2["trainable weights"] == 2 * p and stage2["gradients"] == 2 * p // 8
    stage1 = held(zero_stage=1)
    assert stage1["gradients"] == 2 * p and stage1["optimizer states"] == 12 * p // 8
    offloaded = held(zero_stage=2, offload_optimizer=True)
    assert "optimizer states" in offloaded and offloaded["optimizer states"] == 12 * p // 8
    plain = held(zero_stage=None, processes=1, dtype="float32")  # DDP, fp32 weights: 4 + 4 + 8 bytes, nothing sharded
    assert plain == {"trainable weights": 4 * p, "gradients": 4 * p, "optimizer states": 8 * p}
    lora = held(zero_stage=None, processes=1, use_peft=True, beta=0.04)  # the reference is the adapter switched off
    assert "reference model" not in lora and lora["frozen base weights"] == 2 * p


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_has_a_plan_and_a_verdict(recipe, capsys):
    assert main([str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan = out[out.index("memory plan (") :]
    assert "largest phase, " in plan and "verdict: " in plan
    if recipe in GPU_RECIPES:  # planned on the GPU of its source document (gpu_memory_gb), which it fits
        assert "(gpu_memory_gb)" in plan and "verdict: fits" in plan, plan


def test_qwen7b_without_zero_on_one_80gb_gpu_does_not_fit_and_says_what_does():
    recipe, _ = load_recipe(
        [str(REPO / "recipes" / "qwen7b.yaml"), "--accelerate_config", "ddp", "--num_processes", "1",
         "--dtype", "float32"], for_run=False,
    )  # fmt: skip
    plan, fix = memory.memory_plan(recipe)
    device = plan.unfit
    assert device is not None and device.capacity == 80 * mp.GiB
    assert device.largest().name.startswith("optimizer states")
    assert device.peak > 2 * device.capacity  # 7.6B parameters x 16 bytes and a reference model
    key, value, changed = fix
    assert (key, value) == ("use_peft", True) and changed.unfit is None
    lines = "\n".join(memory.plan_lines(recipe))
    assert "verdict: does not fit" in lines and "fix: use_peft: true (fits: " in lines


def test_a_recipe_that_cannot_fit_exits_2_before_anything_loads(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = [str(REPO / "recipes" / "tiny.yaml"), "--tiny_hidden_size", "4096", "--output_dir", str(out)]
    recipe, _ = load_recipe(argv, for_run=False)
    plan, _ = memory.memory_plan(recipe, for_run=True)
    checkpointed = mp.make_plan(plan.shape, replace(plan.settings, activation_checkpointing=True))
    assert checkpointed.devices[0].peak < plan.devices[0].peak
    ram = int((plan.devices[0].peak + checkpointed.devices[0].peak) / 2 / mp.FITS_WITHIN)  # fits only checkpointed
    monkeypatch.setattr(memory, "_host_memory", lambda on_gpu: (ram, "this machine's RAM"))
    assert main([*argv, "--max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert "memory plan: does not fit: RAM needs" in line and f"of {mp.gb(ram)}" in line
    assert "the largest term is training micro-batch" in line
    assert "set activation_checkpointing: true (fits: " in line and "memory_check: warn" in line
    assert not out.exists()  # nothing built, loaded or written


def test_memory_check_warn_runs_a_recipe_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(memory, "_host_memory", lambda on_gpu: (mp.GiB, "this machine's RAM"))
    argv = [str(REPO / "recipes" / "tiny.yaml"), "--tiny_hidden_size", "4096"]
    with pytest.raises(RecipeError, match="memory plan: does not fit"):
        memory.check_memory(load_recipe(argv, for_run=False)[0])
    memory.check_memory(load_recipe([*argv, "--memory_check", "warn"], for_run=False)[0])


def test_a_run_plans_for_this_machines_gpu_and_a_dry_run_for_the_recipes(monkeypatch):
    recipe, _ = load_recipe([str(REPO / "recipes" / "qwen1.5b-gsm8k-8gb.yaml")], for_run=False)
    assert memory.memory_plan(recipe)[0].settings.on_gpu  # a dry run here: the recipe's 8 GB GPU
    assert not memory.memory_plan(recipe, for_run=True)[0].settings.on_gpu  # a run here: this CPU
    monkeypatch.setattr(memory, "this_machine", lambda: Machine(cuda_devices=1, bf16=True, packages=frozenset()))
    assert memory.memory_plan(recipe, for_run=True)[0].settings.on_gpu
