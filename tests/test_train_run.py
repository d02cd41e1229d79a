"""The training entry point end to end on the embedded task: outputs, shapes, and (in one test) real learning."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hf_grpo.evaluation.stats import gain_from_run
from hf_grpo.train import main

from .helpers.common import REPO, run_module


def test_short_run_writes_every_output(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "recipes/tiny.yaml",
            "--output_dir",
            str(out),
            "--max_steps",
            "4",
            "--warm_start_steps",
            "30",
            "--logging_steps",
            "1",
            "--arithmetic_eval_size",
            "16",
            "--arithmetic_train_size",
            "64",
            "--per_device_train_batch_size",
            "32",
        ]
    )
    assert code == 0
    adapter = load_file(out / "adapter_model.safetensors")
    assert any("lora_B" in name for name in adapter)
    assert any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name), "LoRA B never moved from 0"
    assert (out / "base_model" / "model.safetensors").is_file()
    history = json.loads((out / "training_history.json").read_text())
    logged = [r for r in history if "reward" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    for key in ("reward", "accuracy", "grade/wrong", "grade/unparseable", "frac_reward_zero_std", "reward/min"):
        assert key in logged[0], key
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) == {"before", "after", "gain", "settings", "watch", "seconds"}
    assert list(results["seconds"]) == ["before", "after"]  # no periodic evaluations here
    assert all(seconds > 0 for seconds in results["seconds"].values())
    assert results["watch"]["stopped"] is None  # the watch ran; nothing stopped a 4-step tiny run
    settings = results["settings"]  # how the numbers were measured, for the card's model-index
    assert settings["dataset"] == "arithmetic" and settings["split"] == "test" and settings["num_problems"] == 16
    assert settings["decoding"] == "greedy" and settings["task"] == "gsm8k" and settings["max_new_tokens"] > 0
    for phase in (results["before"], results["after"]):
        assert 0.0 <= phase["accuracy"] <= 1.0
        assert phase["correct"] + phase["wrong"] + phase["unparseable"] == phase["total"] == 16
    gain = results["gain"]  # paired per problem, from eval_before.jsonl / eval_after.jsonl
    assert gain["n"] == 16 and gain["gain"] == results["after"]["accuracy"] - results["before"]["accuracy"]
    assert gain["ci95"][0] <= gain["gain"] <= gain["ci95"][1]
    assert (out / "training_curves.png").stat().st_size > 10_000
    assert len((out / "eval_after.jsonl").read_text().splitlines()) == 16


def test_evaluate_reproduces_the_runs_eval_results(tmp_path, capsys):
    """`python -m hf_grpo.evaluate` on the adapter and on the base gives the run's own after/before numbers."""
    from hf_grpo.evaluate import main as evaluate_main

    out = tmp_path / "run"
    assert (
        main(
            [
                "recipes/tiny.yaml",
                "--output_dir",
                str(out),
                "--max_steps",
                "4",
                "--warm_start_steps",
                "120",
                "--arithmetic_eval_size",
                "24",
                "--per_device_train_batch_size",
                "32",
            ]
        )
        == 0
    )
    results = json.loads((out / "eval_results.json").read_text())
    capsys.readouterr()
    for target, phase in ((out, "after"), (out / "base_model", "before")):
        assert evaluate_main([str(target)]) == 0
        printed = json.loads(capsys.readouterr().out)
        for key in ("accuracy", "correct", "wrong", "unparseable", "total"):
            assert printed[key] == results[phase][key], (phase, key)


def readme_run_command() -> str:
    """The command that README's set-up block (``<!-- run-command -->``) ends with: the embedded default run."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- run-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return block.strip().split("&&")[-1].strip()


@pytest.mark.slow  # ~2 min on 2 cores: the default tier stays under 15 minutes
def test_default_run_learns(tmp_path):
    """README's first command, as printed, learns: held-out gain >= 0.20 with its paired 95% interval above 0.10.

    The command runs in an empty working directory (its outputs land in ``outputs/tiny`` there) with this
    environment's ``accelerate``; the recipe's seed, and whatever OMP_NUM_THREADS the test run has (none: 1 thread).
    benchmarks/default_learning.py runs the other seeds, ``python -m`` and 2 threads.
    """
    command = readme_run_command()
    assert command == "HF_HUB_OFFLINE=1 accelerate launch -m hf_grpo.train", command
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # leading VAR=value words
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[0] == "accelerate", words
    accelerate = Path(sys.executable).parent / "accelerate"  # this environment's, as README's activated venv has it
    start = time.perf_counter()
    result = subprocess.run(
        [str(accelerate), *words[1:]],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    gain = gain_from_run(tmp_path / "outputs" / "tiny")
    summary = {k: gain[k] for k in ("n", "before_accuracy", "after_accuracy", "gain", "ci95", "right_to_wrong")}
    summary.update(wrong_to_right=gain["wrong_to_right"], seconds=round(seconds))
    assert gain["gain"] >= 0.20, summary
    assert gain["ci95"][0] >= 0.10, summary


@pytest.mark.parametrize("recipe", ["tiny.yaml"])
def test_accelerate_launch_without_recipe_uses_the_default(recipe):
    # `accelerate launch -m hf_grpo.train` with no argument resolves the shipped tiny recipe
    result = run_module("hf_grpo.train", "--dry-run", timeout=120)
    assert result.returncode == 0
    assert str(REPO / "recipes" / recipe) in result.stdout or f"recipes/{recipe}" in result.stdout
