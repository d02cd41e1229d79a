"""Sizes: prompt + completion checked against the model's context before anything loads, and an
estimated-time line once a run's first steps are measured (``max_steps: 1e29`` says how long it would take)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from safetensors.numpy import save_file
from transformers import Qwen2Config, TrainerCallback

from hf_grpo.recipe import checks_env
from hf_grpo.train import main
from hf_grpo.training import eta

from .helpers.common import REPO, run_module
from .helpers.trainers import make_trainer


TINY = str(REPO / "recipes" / "tiny.yaml")


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_completion_longer_than_the_tiny_context_exits_2_at_dry_run():
    result = run_module("hf_grpo.train", TINY, "--max_completion_length", "1000000", "--dry-run")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf_grpo: error:"), result.stderr
    assert "Traceback" not in result.stderr
    for part in ("max_completion_length 1000000", "max_position_embeddings 256", "lower max_completion_length"):
        assert part in lines[0]


@pytest.fixture
def saved_model(tmp_path):
    """A model directory holding its config (all the size check reads: the tiny model's context, 256) and a weights
    file (its header is checked, not its weights: one tensor stands in for them)."""
    path = tmp_path / "model"
    Qwen2Config(
        hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=256
    ).save_pretrained(path)
    save_file({"w": np.zeros(1, np.float32)}, str(path / "model.safetensors"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model_name_or_path: {path}\ndataset_name: arithmetic\nreport_to: none\nmax_completion_length: 16\n"
        f"output_dir: {tmp_path / 'out'}\n"
    )
    return recipe


@pytest.mark.parametrize(
    ("overrides", "parts"),
    [
        (["--generation.max_model_len", "4096"], ["generation.max_model_len 4096", "max_position_embeddings 256"]),
        (["--max_completion_length", "256"], ["max_completion_length 256", "max_position_embeddings 256"]),
        (
            ["--generation.max_model_len", "128", "--max_completion_length", "128"],
            ["max_completion_length 128", "generation.max_model_len"],
        ),
        (["--vllm_max_model_length", "1024"], ["vllm_max_model_length 1024", "max_position_embeddings 256"]),
    ],
    ids=["max-model-len-over-config", "completion-fills-context", "completion-fills-max-model-len", "trl-key"],
)
def test_a_saved_model_s_config_bounds_the_sizes(saved_model, capsys, overrides, parts):
    assert main([str(saved_model), *overrides, "--dry-run"]) == 2
    line = error_line(capsys)
    for part in parts:
        assert part in line, line


def test_sizes_within_the_context_pass(saved_model, capsys):
    assert (
        main([str(saved_model), "--generation.max_model_len", "256", "--max_completion_length", "200", "--dry-run"])
        == 0
    )
    assert main([TINY, "--dry-run"]) == 0


def test_vllm_s_override_variable_allows_a_longer_max_model_len(saved_model, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert main([str(saved_model), "--generation.max_model_len", "4096", "--dry-run"]) == 0


def test_a_config_that_cannot_be_read_is_skipped(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model_name_or_path: nobody-here/not-a-model-xyz\ndataset_name: arithmetic\nreport_to: none\n"
        f"max_completion_length: 100000\noutput_dir: {tmp_path / 'out'}\n"
    )
    assert main([str(recipe), "--dry-run"]) == 0, capsys.readouterr().err


def test_the_tiny_context_is_the_embedded_model_s():
    from hf_grpo.models.tiny import build_model, build_tokenizer

    assert checks_env.TINY_CONTEXT == build_model(build_tokenizer()).config.max_position_embeddings


# ---------------------------------------------------------------------------------------------------------------------
# Estimated time


class FakeState:
    def __init__(self, max_steps):
        self.global_step, self.max_steps, self.is_world_process_zero = 0, max_steps, True


def run_fake(monkeypatch, max_steps, seconds_per_step, steps=3):
    clock = [1000.0]
    monkeypatch.setattr(eta.time, "monotonic", lambda: clock[0])
    callback, state = eta.EtaCallback(), FakeState(max_steps)
    callback.on_train_begin(None, state, None)
    for _ in range(steps):
        clock[0] += seconds_per_step
        state.global_step += 1
        callback.on_step_end(None, state, None)


def test_the_estimate_names_the_steps_and_the_time(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="hf_grpo.training.eta"):
        run_fake(monkeypatch, 100_000_000_000_000_000_000_000_000_000, 3.1)
    lines = [r for r in caplog.records if r.name == "hf_grpo.training.eta"]
    assert len(lines) == 2, [r.getMessage() for r in lines]  # the estimate once, and the warning
    info, warning = lines
    assert info.levelno == logging.INFO
    assert info.getMessage().startswith("step 2 of 100000000000000000000000000000: 3.1 s/step, about ")
    assert "days for max_steps" in info.getMessage()
    assert warning.levelno == logging.WARNING and "max_steps" in warning.getMessage()


def test_a_short_run_gets_no_warning(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="hf_grpo.training.eta"):
        run_fake(monkeypatch, 40, 2.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "hf_grpo.training.eta"]
    assert lines == ["step 2 of 40: 2.0 s/step, about 76 s for max_steps (38 steps left)"]


class StopAfter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= 3:
            control.should_training_stop = True


def test_a_real_run_prints_the_estimate(tmp_path, caplog):
    trainer = make_trainer(
        tmp_path,
        hidden_size=16,
        callbacks=[StopAfter()],
        max_steps=10**12,
        max_completion_length=4,
        per_device_train_batch_size=8,
    )
    with caplog.at_level(logging.INFO, logger="hf_grpo.training.eta"):
        trainer.train()
    assert trainer.state.global_step == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "hf_grpo.training.eta"]
    assert lines and lines[0].startswith("step 2 of 1000000000000: "), lines
