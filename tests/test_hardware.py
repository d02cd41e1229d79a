"""A recipe that asks for hardware this machine lacks exits 2 within seconds, naming the setting and the fix."""

from __future__ import annotations

import time

import pytest

from hf_grpo.generation.settings import GenerationArguments
from hf_grpo.launch.hardware import CPU_SETTINGS, Machine, hardware_problems, this_machine
from hf_grpo.launch.launcher import needs_launcher
from hf_grpo.launch.processes import Layout, accelerate_command
from hf_grpo.recipe import RecipeError, load_recipe

from .helpers.common import REPO, run_module


CPU = Machine(cuda_devices=0, bf16=False, packages=frozenset({"deepspeed"}))
ONE_GPU = Machine(cuda_devices=1, bf16=True, packages=frozenset({"deepspeed", "vllm"}))
OLD_GPUS = Machine(cuda_devices=8, bf16=False, packages=frozenset({"deepspeed", "vllm"}))
cpu_only = pytest.mark.skipif(this_machine().cuda_devices > 0, reason="checks what a machine without a GPU refuses")


def layout(distributed="NO", processes=1, machines=1, precision=None, name=None):
    path = REPO / "accelerate_configs" / f"{name}.yaml" if name else None
    return Layout(processes, machines, distributed, path, mixed_precision=precision)


def problems(values=None, lay=None, gen=None, machine=CPU, **kw):
    return hardware_problems(values or {}, {}, lay or layout(), gen or GenerationArguments(), machine, **kw)


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"bf16": True}, "bf16: false"),
        ({"fp16": True}, "fp16: false"),
        ({"attn_implementation": "flash_attention_2"}, "attn_implementation: sdpa"),
        ({"load_in_4bit": True}, "load_in_4bit: false"),
        ({"optim": "paged_adamw_8bit"}, "optim: adamw_torch"),
        ({"use_liger_kernel": True}, "use_liger_kernel: false"),
    ],
)
def test_cpu_cannot_run_gpu_only_settings(values, fragment):
    found = problems(values)
    assert len(found) == 1 and fragment in found[0], found
    assert problems(values, machine=ONE_GPU) == []


def test_half_precision_weights_are_legal_on_a_cpu_but_mapped_by_a_miniature():
    assert problems({"dtype": "bfloat16"}) == []
    assert any(s.key == "dtype" and not s.error for s in CPU_SETTINGS)


def test_accelerate_mixed_precision_and_fsdp_need_a_gpu():
    found = problems(lay=layout("DEEPSPEED", 2, precision="bf16", name="zero2"))
    assert any("accelerate_config zero2 has mixed_precision bf16" in p and "--mixed_precision no" in p for p in found)
    found = problems(lay=layout("FSDP", 2, precision="no", name="fsdp2"))
    assert any("FSDP" in p and "plain data parallel" in p for p in found), found
    assert problems(lay=layout("FSDP", 1, precision="bf16", name="fsdp2"), machine=ONE_GPU) == []


def test_vllm_layouts_need_vllm_and_a_gpu_unless_a_miniature_stands_in():
    colocate = GenerationArguments(backend="vllm_colocate")
    assert any("vllm is not installed" in p for p in problems(gen=colocate))
    assert problems(gen=colocate, vllm_standin=True) == []
    server = GenerationArguments(backend="vllm_server")
    assert any("vLLM on CUDA GPUs" in p for p in problems({"use_peft": True}, gen=server))
    # a server someone else runs (base_url) needs nothing on this machine when only the adapter is synced
    assert problems({"use_peft": True}, gen=GenerationArguments(backend="vllm_server", base_url="http://h:8000")) == []


def test_more_processes_than_gpus():
    found = problems(lay=layout("DEEPSPEED", 8, name="zero3"), machine=ONE_GPU)
    assert any("need 8 GPUs and this machine has 1" in p and "num_processes" in p for p in found), found
    server = GenerationArguments(backend="vllm_server", gpus=[0], weight_sync="lora")
    found = problems({"use_peft": True}, lay=layout("MULTI_GPU", 1), gen=server, machine=ONE_GPU)
    assert any("vLLM server GPU" in p for p in found), found
    assert any("bf16" in p for p in problems({"bf16": True}, machine=OLD_GPUS))


def test_one_process_with_an_accelerate_config_goes_through_accelerate():
    """`python -m hf_grpo.train` of the 8 GB recipe (1 process, ZeRO-2 offload) must not train without DeepSpeed."""
    recipe, _ = load_recipe([str(REPO / "recipes/qwen1.5b-gsm8k-8gb.yaml")], for_run=False)
    assert recipe.layout.num_processes == 1 and needs_launcher(recipe)
    assert not needs_launcher(load_recipe([str(REPO / "recipes/tiny.yaml")], for_run=False)[0])


def test_several_processes_without_a_config_use_the_multi_process_launcher():
    cmd = accelerate_command(layout("MULTI_GPU", 2), ["recipes/tiny.yaml"])
    assert "--multi_gpu" in cmd  # plain `--num_processes 2` is one process on a machine without several GPUs
    assert "--multi_gpu" not in accelerate_command(layout("NO", 1), [])


@cpu_only
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["recipes/qwen7b.yaml"], ["bf16: true", "set bf16: false", "--miniature"]),
        (["recipes/tiny.yaml", "--accelerate_config", "fsdp2", "--num_processes", "2"], ["FSDP", "ddp / zero2"]),
        (["recipes/qwen7b-lora-dedicated.yaml"], ["--mixed_precision no", "vLLM on CUDA GPUs"]),
    ],
)
def test_gpu_recipes_exit_2_before_loading_anything(args, fragments):
    result = run_module("hf_grpo.train", *args, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    line = [x for x in result.stderr.splitlines() if x.startswith("hf_grpo: error:")]
    assert len(line) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in line[0]
    assert "Traceback" not in result.stderr
    assert "warm start" not in result.stderr and "Loading weights" not in result.stderr


@cpu_only
def test_accelerate_launch_with_a_bf16_config_exits_2_naming_the_flag():
    """The issue's case: ZeRO-2 offload config (mixed_precision bf16), 2 processes, on a CPU machine."""
    import subprocess
    import sys

    start = time.monotonic()
    # port 0: a free one, not accelerate's 29500, which a test on the other xdist worker may be listening on
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/zero2_offload.yaml",
         "--num_processes", "2", "--main_process_port", "0", "-m", "hf_grpo.train", "recipes/tiny.yaml"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    errors = [x for x in result.stderr.splitlines() if x.startswith("hf_grpo: error:")]
    # Each process finds it; the first to exit makes accelerate's launcher SIGTERM the other, which may or may not
    # have printed its line by then (CI under load: it had not). That one says why it stopped.
    assert 1 <= len(errors) <= 2 and len(set(errors)) == 1, result.stderr[-3000:]
    assert "mixed_precision bf16" in errors[0] and "pass --mixed_precision no to accelerate launch" in errors[0]
    stops = [x for x in result.stderr.splitlines() if x.startswith("hf_grpo: stopped by a signal")]
    assert len(errors) + len(stops) <= 2 and all("if another process printed an error above" in x for x in stops)
    assert "hf_grpo/train.py" not in result.stderr  # accelerate's launcher reports the exit; no traceback of ours
    assert "warm start" not in result.stderr
    assert time.monotonic() - start < 120


@cpu_only
def test_dry_run_reports_what_this_machine_cannot_run(capsys):
    from hf_grpo.train import main

    assert main(["recipes/qwen7b.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "this machine cannot run it as written" in out and "bf16: true" in out


def test_full_finetuning_of_half_weights_needs_deepspeed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("dtype: bfloat16\nuse_peft: false\n")
    with pytest.raises(RecipeError, match="dtype: float32 and keep bf16: true"):
        load_recipe([str(recipe)], for_run=False)
    recipe.write_text("dtype: bfloat16\nuse_peft: true\n")  # PEFT keeps its adapters in fp32
    load_recipe([str(recipe)], for_run=False)
    recipe.write_text("dtype: bfloat16\nuse_peft: false\naccelerate_config: zero3\n")  # DeepSpeed keeps fp32 masters
    load_recipe([str(recipe)], for_run=False)


def test_the_math_recipe_trains_fp32_weights():
    recipe, _ = load_recipe([str(REPO / "recipes/qwen-math-1.5b-math.yaml")], for_run=False)
    assert recipe.model.dtype == "float32" and recipe.values["bf16"] is True and recipe.model.use_peft is False


def test_why_the_check_exists_bf16_weights_lose_small_updates():
    """Plain AdamW on bf16 parameters at a fine-tuning learning rate leaves most elements unchanged (the MATH
    recipe's former setting); the same steps on fp32 master weights move every element."""
    import torch

    torch.manual_seed(0)
    start = torch.randn(256, 256) * 0.02
    changed = {}
    for dtype in (torch.bfloat16, torch.float32):
        weight = torch.nn.Parameter(start.clone().to(dtype))
        optimizer = torch.optim.AdamW([weight], lr=1e-5, weight_decay=0.0)
        for _ in range(10):
            weight.grad = torch.randn_like(weight)
            optimizer.step()
        changed[dtype] = (weight.detach().float() != start.to(dtype).float()).float().mean().item()
    assert changed[torch.float32] > 0.99
    assert changed[torch.bfloat16] < 0.5, changed  # most updates round away
