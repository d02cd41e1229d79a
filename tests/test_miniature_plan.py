"""What --miniature swaps, checked without training: the dry-run of every recipe says exactly what differs.

The runs themselves are in tests/test_miniatures.py (marker ``miniature``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

from hf_grpo.data.loaders import DataArguments, load_grpo_datasets, source_splits
from hf_grpo.launch.hardware import this_machine
from hf_grpo.launch.launcher import plan_commands
from hf_grpo.miniature.assets import (
    GSM8K,
    MATH,
    MATH500,
    OPENMATH,
    AssetSpec,
    PromptFormat,
    SplitSpec,
    architecture_family,
    ensure_assets,
)
from hf_grpo.recipe import RecipeError, load_recipe, miniaturize
from hf_grpo.train import main

from .helpers.common import REPO
from .helpers.launching import free_port
from .helpers.miniature_server import serve_command


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


cpu_only = pytest.mark.skipif(this_machine().cuda_devices > 0, reason="the CPU mapping applies without a GPU")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_has_a_miniature_that_keeps_its_layout(recipe, capsys):
    assert main([str(recipe), "--miniature", "--dry-run"]) == 0
    out = capsys.readouterr().out
    values = yaml.safe_load(recipe.read_text())
    assert "miniature: only these values differ from the recipe" in out
    assert "this machine cannot run it" not in out
    mini, _ = load_recipe([str(recipe), "--miniature"], for_run=False)
    assert mini.layout.num_processes == 2
    if values.get("accelerate_config"):
        assert f"accelerate_configs/{values['accelerate_config']}.yaml" in out  # the same accelerate config
        assert mini.layout.distributed_type == load_recipe([str(recipe)], for_run=False)[0].layout.distributed_type
    # the recipe's generation layout (backend auto: as it resolves on this machine for the recipe itself)
    assert mini.generation.backend == load_recipe([str(recipe)], for_run=False)[0].generation.backend
    assert mini.rewards.reward_funcs == values.get("reward_funcs", mini.rewards.reward_funcs)
    for key in ("loss_type", "advantage_estimator", "dynamic_sampling", "beta", "scale_rewards", "epsilon_high"):
        if key in values:
            assert mini.values[key] == values[key], key  # the algorithm is the recipe's
    if values.get("model_name_or_path", "tiny") != "tiny":
        assert "model_name_or_path:" in out and values["model_name_or_path"] in out
        assert mini.model.model_name_or_path.endswith("/model")
    if values.get("num_machines", 1) > 1:
        # one launch per simulated machine, and the command each real node would run
        assert out.count("--machine_rank") == 4 and "on separate machines" in out
    assert mini.values["output_dir"].endswith("-miniature")
    assert mini.training.max_steps == 2


def test_command_line_values_are_never_swapped():
    recipe, _ = load_recipe(
        ["recipes/qwen7b.yaml", "--miniature", "--max_steps", "3", "--output_dir", "/tmp/x"], for_run=False
    )
    assert recipe.training.max_steps == 3 and recipe.training.output_dir == "/tmp/x"
    assert "max_steps" not in {s.key for s in recipe.miniature.swaps}


@cpu_only
def test_gpu_only_settings_are_mapped_and_printed(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-7B-Instruct\ndataset_name: gsm8k\nuse_peft: true\ndtype: bfloat16\n"
        "bf16: true\nattn_implementation: flash_attention_2\naccelerate_config: zero2\nnum_processes: 8\n"
    )
    assert main([str(path), "--miniature", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for line in (
        "bf16: True -> False",
        "dtype: bfloat16 -> float32",
        "attn_implementation: flash_attention_2 -> sdpa",
        "num_processes: 8 -> 2",
        "--mixed_precision no",
    ):
        assert line in out, line


def test_the_tiny_model_behind_a_server_is_refused_and_its_miniature_gets_a_model_folder(capsys):
    """`--miniature` of the tiny recipe with a vLLM server passed --dry-run, then the stand-in server was
    handed the name `tiny` and went to the Hub. Without --miniature the recipe is refused (no folder for a server);
    with it the miniature swaps in a Qwen2 model folder that both the server and the trainer load."""
    argv = ["recipes/tiny.yaml", "--generation.backend", "vllm_server"]
    with pytest.raises(
        RecipeError, match=r"model_name_or_path: tiny .* generation.backend: transformers, or add --miniature"
    ):
        load_recipe(argv, for_run=False)
    recipe, _ = load_recipe([*argv, "--miniature"], for_run=False)
    swapped = {s.key: s for s in recipe.miniature.swaps}["model_name_or_path"]
    assert swapped.before == "tiny" and "qwen2" in swapped.after and "the embedded tiny model" in swapped.why
    assert main([*argv, "--miniature", "--dry-run"]) == 0
    served = serve_command(recipe.model.use_peft, {}, swapped.after)  # the stand-in, or vLLM's CPU build if installed
    assert served in capsys.readouterr().out  # the server loads that folder
    plain, _ = load_recipe(["recipes/tiny.yaml", "--miniature"], for_run=False)  # in-process: still built there
    assert plain.model.model_name_or_path == "tiny"


def test_the_launched_training_processes_train_the_model_the_server_serves():
    """The launcher of `tiny --miniature` with a vLLM server swapped in a model folder for its server, but the
    training processes it started (given the server's --generation.base_url) kept the embedded tiny model: the
    adapters they sent did not fit the server's model (a LoRA size mismatch mid-run with tiny_hidden_size: 32)."""
    argv = ["recipes/tiny.yaml", "--generation.backend", "vllm_server", "--tiny_hidden_size", "32", "--miniature"]
    recipe, _ = load_recipe(argv, for_run=False)
    server, train = plan_commands(recipe, argv)
    served = recipe.model.model_name_or_path
    assert server.role == "server" and served in server.argv and served != "tiny", server.argv
    train_argv = train.argv[train.argv.index("hf_grpo.train") + 1 :]
    assert "--generation.base_url" in train_argv, train_argv
    trained, _ = load_recipe(train_argv, for_run=False)  # as each training process loads it
    assert trained.model.model_name_or_path == served


def test_a_trl_server_without_a_generation_section_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("use_vllm: true\nvllm_mode: server\n")
    with pytest.raises(RecipeError, match="generation: {backend: vllm_server}"):
        load_recipe([str(path), "--miniature"], for_run=False)


def test_dry_run_shows_trl_vllm_fields_as_the_run_uses_them(capsys):
    assert main(["recipes/tiny.yaml", "--use_vllm", "true", "--vllm_mode", "colocate", "--dry-run"]) == 0
    assert "generation: TRL vLLM (colocate)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, family",
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "qwen2"),
        ("Qwen/Qwen3-8B", "qwen3"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama"),
    ],
)
def test_architecture_family_from_the_name_offline(name, family):
    assert architecture_family(name) == (family, "its name")


def test_architecture_family_from_a_local_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    assert architecture_family(str(tmp_path)) == ("mistral", "its config.json")


def test_the_mirror_replaces_only_the_download(tmp_path):
    """Presets, columns and the held-out split resolve as for the hub; only the bytes come from local files."""
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"{i}\n#### {i}"}) + "\n" for i in range(6)))
    test.write_text(json.dumps({"question": "held out", "answer": "#### 7"}) + "\n")
    args = DataArguments(
        dataset_name="gsm8k", dataset_mirror={"openai/gsm8k:train": str(train), "openai/gsm8k:test": str(test)}
    )
    assert {role: split for role, (_, split) in source_splits(args).items()} == {"train": "train", "eval": "test"}
    train_ds, eval_ds = load_grpo_datasets(args)
    assert len(train_ds) == 6 and len(eval_ds) == 1
    assert eval_ds[0]["solution"] == "#### 7" and eval_ds[0]["prompt"][-1]["content"] == "held out"


def test_the_mirror_covers_exactly_the_splits_the_loader_reads():
    values = {"model_name_or_path": "Qwen/Qwen2.5-Math-1.5B", "dataset_name": "math", "eval_dataset_name": "math500"}
    new, _, _ = miniaturize(values, {}, set())
    assert set(new["dataset_mirror"]) == {f"{MATH}:train", f"{MATH500}:test"}
    values = {"model_name_or_path": "Qwen/Qwen2.5-7B", "dataset_name": "openmathinstruct2", "eval_split_size": 0.01}
    new, _, _ = miniaturize(values, {}, set())
    assert set(new["dataset_mirror"]) == {f"{OPENMATH}:train"} and new["eval_split_size"] == pytest.approx(16 / 512)


@pytest.mark.slow  # builds and warm-starts a model (~90 s in tier 1); every miniature run in tier 2 builds these assets too
def test_assets_have_the_family_the_schema_and_a_warm_started_format(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from hf_grpo.data.loaders import format_prompt
    from hf_grpo.evaluation.core import generate
    from hf_grpo.rewards.functions import grade_completion

    monkeypatch.setenv("HF_GRPO_CACHE", str(tmp_path))
    splits = (
        SplitSpec("train", GSM8K, "train", "question", "answer", "gsm8k"),
        SplitSpec("eval", MATH500, "test", "problem", "answer", "math"),
    )
    spec = AssetSpec("llama", 0, PromptFormat(prompt_style="r1_zero"), "r1_zero", splits)
    assets = ensure_assets(spec)
    assert ensure_assets(spec).root == assets.root  # cached
    config = AutoConfig.from_pretrained(assets.model_dir)  # as save_pretrained writes it (TRL reads architectures)
    assert (
        config.model_type == "llama" and config.architectures == ["LlamaForCausalLM"] and config.dtype == torch.float32
    )
    assert (assets.model_dir / "model.safetensors").is_file()
    rows = read_jsonl(assets.files[f"{MATH500}:test"])
    assert set(rows[0]) == {"problem", "solution", "answer", "subject", "level", "unique_id"}
    train_rows = read_jsonl(assets.files[f"{GSM8K}:train"])
    assert set(train_rows[0]) == {"question", "answer"}
    train_questions = {r["question"] for r in train_rows}
    assert not train_questions & {r["problem"] for r in rows}  # held-out questions are never trained on

    from transformers import AutoModelForCausalLM

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(assets.model_dir),
        AutoTokenizer.from_pretrained(assets.model_dir),
    )
    prompts = [format_prompt(r["problem"], DataArguments(prompt_style="r1_zero")) for r in rows[:16]]
    outs = generate(model, tokenizer, prompts, 32)
    grades = [grade_completion("r1_zero", o[0], r["answer"]) for o, r in zip(outs, rows, strict=False)]
    assert grades.count("unparseable") <= 4, outs[:4]  # the warm start taught the r1_zero format


# One process of a 2-process gloo group (argv: rank, port, cache folder): builds the miniature's assets into its own
# cache, as each machine of a multi-node miniature does, and prints the model folder's files. Two warm-start steps
# (the assets' 200 teach the answer format: test_assets_have_the_family_the_schema_and_a_warm_started_format): what
# is checked is where the files land, and the two-node miniature (tests/test_two_nodes.py) builds full ones per node.
NODE_CACHE_SCRIPT = """
import datetime, os, sys

import torch.distributed as dist

from hf_grpo.miniature import assets

rank, port, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HF_GRPO_CACHE=cache)
assets.WARM_START_STEPS = 2
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
splits = (assets.SplitSpec("train", "openai/gsm8k", "train", "question", "answer", "gsm8k"),)
spec = assets.AssetSpec("llama", 0, assets.PromptFormat(prompt_style="r1_zero"), "r1_zero", splits)
built = assets.ensure_assets(spec)
print("files:", " ".join(sorted(p.name for p in built.model_dir.iterdir())))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes import torch and build the assets side by side
@pytest.mark.subprocess
def test_every_machine_builds_a_complete_cache_whatever_its_rank(tmp_path):
    """Each machine of a multi-node miniature builds the assets into its own cache, inside a started process group:
    the machine whose processes are not global rank 0 gets the model too (transformers' save_pretrained writes
    nothing there), so it loads and trains like the main one."""
    port, caches = str(free_port()), [tmp_path / "node0", tmp_path / "node1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = [sys.executable, "-c", NODE_CACHE_SCRIPT]
    runs = [
        subprocess.Popen([*script, str(rank), port, str(cache)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        for rank, cache in enumerate(caches)
    ]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    for output in outputs:
        assert "config.json" in output and "model.safetensors" in output, output
    for cache in caches:
        (model_dir,) = cache.glob("miniature/*/model")
        assert AutoConfig.from_pretrained(model_dir).architectures == ["LlamaForCausalLM"]
        AutoModelForCausalLM.from_pretrained(model_dir)  # complete: every weight is there (it raises otherwise)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_miniatures_fit_a_one_gpu_machine(recipe, monkeypatch):
    """On a GPU machine a miniature trains on the GPUs it has (here one) and its stand-in server takes none."""
    from hf_grpo import miniature
    from hf_grpo.launch import hardware
    from hf_grpo.launch.hardware import Machine

    one_gpu = Machine(cuda_devices=1, bf16=True, packages=frozenset({"deepspeed"}))
    monkeypatch.setattr(hardware, "this_machine", lambda: one_gpu)
    monkeypatch.setattr(miniature, "this_machine", lambda: one_gpu)
    mini, _ = load_recipe([str(recipe), "--miniature"], for_run=False)
    assert mini.hardware == [] and mini.layout.num_processes == 1
    assert mini.plan.completions_per_generation % mini.plan.num_generations == 0
    assert "bf16" not in {s.key for s in mini.miniature.swaps}  # a bf16 GPU keeps bf16
