"""Every file in recipes/ runs in miniature, as a user runs it: ``python -m hf_grpo.train RECIPE --miniature``.

A miniature keeps the recipe's accelerate config (ZeRO-3 with zero3_init_flag, ZeRO-2 with CPU offload, two
simulated machines), its generation layout (vLLM's CPU build or the CPU stand-in for ``vllm serve``, and the stand-in
for TRL's colocated ``vllm.LLM``, started and stopped by the same launcher), rewards, loss, advantage estimator,
dynamic sampling, before/after evaluation and checkpoints; it swaps the model, the data and the sizes
(``hf_grpo.miniature``). Each test trains two steps with two processes, checks what the recipe promises, then
resumes from the last checkpoint for one more step. Recipes are discovered by glob, so a new recipe is covered the
day it is added. qwen7b.yaml's miniature trains on a reward with a learning signal in every group: its ZeRO-3
full fine-tune must move every weight.

Run with ``python -m pytest --tier 2`` (CI runs this tier after the default one; ``-m miniature`` runs only these).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from safetensors.torch import load_file

from .helpers.common import REPO, run_module, shared_tmp
from .helpers.miniature_server import adapters_loaded, serve_command, serves_real_vllm


pytestmark = [pytest.mark.miniature, pytest.mark.subprocess, pytest.mark.slow]
SPREAD_OVER_WORKERS = True  # under -n 2, one recipe per worker at a time (tests/conftest.py); the cache is shared

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
TIMEOUT = 900
# A reward with a learning signal in every group, whatever the policy writes (it needs the whole batch in one call)
ORDINAL = ["--reward_funcs", "tests.scripts.ordinal_reward:ordinal", "--reward_isolation", "false"]
# Recipes whose miniature trains on ORDINAL (first run and resume): a full fine-tune must then move every weight,
# which the recipe's own reward cannot promise of the tiny policy (assert_trained). qwen7b.yaml: ZeRO-3
# (zero3_init_flag), its optimizer stepping every shard. Not on the resumed step alone: the resumed scheduler keeps
# the first run's linear decay over max_steps 2, so step 3's learning rate is 0.
EVERY_WEIGHT_MOVES = {"qwen7b.yaml"}


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    """One asset cache for the tier, off the user's, shared by the -n workers: each distinct model family / data
    format is built once, under the assets' file lock (``hf_grpo.miniature.assets.ensure_assets``)."""
    return {"HF_GRPO_CACHE": str(shared_tmp(tmp_path_factory, "hf_grpo_cache")), "OMP_NUM_THREADS": "1"}


def train(*args: str, env: dict) -> tuple[int, str]:
    result = run_module("hf_grpo.train", *args, env=env, timeout=TIMEOUT)
    return result.returncode, result.stdout + result.stderr


def history_of(out) -> list[dict]:
    return [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]


def history_steps(out) -> list[int]:
    return [r["step"] for r in history_of(out)]


def recipe_values(recipe) -> dict:
    return yaml.safe_load(recipe.read_text())


def trained_and_built(out) -> tuple[dict, dict]:
    """A full fine-tune's saved weights and those of the model the miniature built (its ``model_name_or_path``)."""
    built = yaml.safe_load((out / "recipe.yaml").read_text())["model_name_or_path"]
    return load_file(out / "model.safetensors"), load_file(os.path.join(built, "model.safetensors"))


def warm_steps(values: dict) -> int:
    """The steps of a pretrained policy's warm start on its adapter (the embedded tiny model is built warm)."""
    return values.get("warm_start_steps", 0) if values.get("model_name_or_path") != "tiny" else 0


def assert_trained(out, values: dict, history: list[dict]) -> None:
    """The policy's weights moved: the LoRA B matrices left zero, or the full model differs from the built one.

    A recipe without dynamic sampling (which looks further for a group whose rewards differ) has a gradient only if
    one of its two steps' groups got differing rewards: the built 2-layer model answers about a third of the held-out
    problems right, and on some random streams every sample of both steps scored the same (a full fine-tune on one
    machine's floating-point path; qwen1.5b-gsm8k-8gb's LoRA once HF generate drew one uniform per row). Without such
    a group the weights must stay exactly as built, with gradient norm 0; EVERY_WEIGHT_MOVES and the
    dynamic-sampling recipes then show the same setups moving their weights.

    A warm-started LoRA recipe (the real-model ones: the miniature keeps their warm start) has moved LoRA B before
    GRPO starts, so GRPO's own part is read from its gradient norms: above 0 on some step if a group had differing
    rewards, or if the recipe has a KL term (``beta``: the warm-started adapter is away from its reference, the
    adapter switched off) and no dynamic sampling (whose fill groups are masked out of the loss), else 0 on every
    step. Warm-started on smollm2-135m-arith's named gold lines (``7 jars of 9 apples: 7 * 9 = 63``), the 2-layer
    policy writes runs of digits and may score nothing: that miniature then checks the zero gradient."""
    signal = any(r["frac_reward_zero_std"] < 1 for r in history)  # a group with a learning signal
    if values.get("use_peft"):
        adapter = load_file(out / "adapter_model.safetensors")
        moved = any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name)
        if warm_steps(values):
            pulled = signal or (values.get("beta", 0.0) > 0 and not values.get("dynamic_sampling"))
            grads = [r["grad_norm"] for r in history]
            assert moved and (max(grads) > 0 if pulled else max(grads) == 0), (moved, signal, grads)
            return
        assert moved if signal else not moved and all(r["grad_norm"] == 0 for r in history), ("LoRA B moved:", moved)
        return
    trained, base = trained_and_built(out)
    changed = [name for name, t in trained.items() if name in base and not t.equal(base[name])]
    assert set(base) <= set(trained), "the saved model lacks weights of the built one"
    if signal:
        assert changed, "full fine-tuning changed no weight"
    else:
        assert not changed and all(r["grad_norm"] == 0 for r in history), (changed[:5], history)
    assert all(t.dtype.is_floating_point and t.element_size() == 4 for t in trained.values()), "weights not fp32"


def assert_generation_layout(out, values: dict, log: str) -> None:
    """The generation layout ran as the recipe says: a server the launcher started, served the model, synced to
    every optimizer step and stopped (real vLLM or the stand-in, whichever serves here), or TRL's colocated engine
    (the stand-in package). ``values``: the resolved recipe (``recipe.yaml``)."""
    generation = values.get("generation") or {}
    backend = generation.get("backend")
    if backend == "vllm_server":
        server_log = (out / "vllm_server.log").read_text()
        real = serves_real_vllm(values.get("use_peft"), generation)
        assert serve_command(values.get("use_peft"), generation, values["model_name_or_path"]) in log, log[-6000:]
        pid = int(re.search(r"stopping the vLLM server \(pid (\d+)\)", log).group(1))
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the launcher stopped the server
        if values.get("use_peft"):
            assert len(adapters_loaded(server_log, real)) >= 2, server_log[-2000:]  # one adapter per optimizer step
        else:  # full sync: the stand-in (vLLM's CPU build cannot receive TRL's NCCL transfer)
            assert len(re.findall(r"loaded \d+ tensors .* from the trainer", server_log)) >= 2, server_log[-2000:]
    elif backend == "vllm_colocate":
        assert "CPU stand-in for vllm.LLM" in log


def assert_first_run(out, values: dict, log: str) -> dict:
    """What a recipe's miniature promises after its two steps; returns the resolved recipe (``recipe.yaml``)."""
    assert "training on 2 process(es)" in log
    warm = warm_steps(values)
    if warm:  # a pretrained policy's warm start, on both processes (then process 0's weights everywhere)
        assert f"warm start: {warm} steps" in log
    config = values.get("accelerate_config")
    if config and config.startswith(("zero", "multinode")):
        assert "training on 2 process(es), DEEPSPEED" in log
    if values.get("num_machines", 1) > 1:
        assert "--machine_rank 1" in log or len(re.findall(r"training on 2 process", log)) == 2
    assert history_steps(out) == [1, 2]
    history = history_of(out)
    for name in values.get("reward_funcs", ["gsm8k_correctness"]):
        assert f"rewards/{name.rpartition(':')[2]}/mean" in history[0], name
    if values.get("dynamic_sampling"):
        assert all("dynamic_sampling/rounds" in r for r in history)
    resolved = yaml.safe_load((out / "recipe.yaml").read_text())  # generation.backend auto resolved, as run
    if (resolved.get("generation") or {}).get("overlap"):  # step 1 generated now, step 2's first round during step 1
        assert [r["async/staleness_max"] <= 1 for r in history] == [True, True]
        assert history[0]["async/staleness_max"] == 0
        # step 2 trained on groups of its first round, sent ahead with policy-0, unless dynamic sampling dropped them
        # all (and fill groups are dropped groups: one update old too), so that further rounds filled the step
        assert history[1]["async/staleness_max"] == 1 or history[1].get("dynamic_sampling/rounds", 1) > 1
    results = json.loads((out / "eval_results.json").read_text())
    for phase in ("before", "after"):
        assert results[phase]["total"] == 16
        assert results[phase]["correct"] + results[phase]["wrong"] + results[phase]["unparseable"] == 16
    assert_trained(out, values, history)
    assert_generation_layout(out, resolved, log)
    return resolved


def assert_every_weight_moved(out) -> None:
    """Trained on ORDINAL (a learning signal in every group): every weight differs from the built model's."""
    assert all(r["frac_reward_zero_std"] == 0 and r["grad_norm"] > 0 for r in history_of(out)), history_of(out)
    trained, base = trained_and_built(out)
    unchanged = [name for name, t in base.items() if t.equal(trained[name])]
    assert not unchanged, unchanged


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_runs_in_miniature_and_resumes(recipe, tmp_path, cache_env):
    values = recipe_values(recipe)
    moves = recipe.name in EVERY_WEIGHT_MOVES
    if moves:
        values["reward_funcs"] = [ORDINAL[1]]
    out = tmp_path / "run"
    code, log = train(str(recipe), "--miniature", "--output_dir", str(out), *(ORDINAL if moves else []), env=cache_env)
    assert code == 0, log[-6000:]
    assert_first_run(out, values, log)
    if moves:
        assert "training on 2 process(es), DEEPSPEED" in log
        assert_every_weight_moved(out)

    if values.get("save_strategy", "no") == "no":
        return
    assert (out / "checkpoint-2").is_dir()
    resume = ["--max_steps", "3", "--resume_from_checkpoint", "auto", *(ORDINAL if moves else [])]
    code, log = train(str(recipe), "--miniature", "--output_dir", str(out), *resume, env=cache_env)
    assert code == 0, log[-6000:]
    assert f"resuming from {out / 'checkpoint-2'}" in log
    assert "warm start:" not in log  # the checkpoint holds it
    assert history_steps(out) == [1, 2, 3]


def test_the_tiny_recipe_behind_a_server_trains_the_model_the_server_serves(tmp_path, cache_env):
    """`tiny --miniature` with a vLLM server: the training processes built the embedded tiny model while the server
    served the miniature's model folder, so the first adapter sync failed mid-run with a LoRA size mismatch (at
    tiny_hidden_size 32; at 64 the shapes agreed by chance and the two sides used different tokenizers). Both steps
    sync an adapter to the server; the before/after evaluation (in the training processes) has no part in it."""
    out = tmp_path / "run"
    argv = ["tiny", "--miniature", "--generation.backend", "vllm_server", "--tiny_hidden_size", "32"]
    code, log = train(*argv, "--output_dir", str(out), "--eval_before_after", "false", env=cache_env)
    assert code == 0, log[-6000:]
    assert history_steps(out) == [1, 2]
    resolved = yaml.safe_load((out / "recipe.yaml").read_text())
    served = resolved["model_name_or_path"]
    assert serve_command(True, resolved.get("generation"), served) + " " in log, log[-6000:]
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == served
    real = serves_real_vllm(True, resolved.get("generation"))
    assert len(adapters_loaded((out / "vllm_server.log").read_text(), real)) >= 2  # the trained adapters fit it
