"""Shared fixtures: offline hub settings, a small thread count, and tiny models built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


def run_module(module: str, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` in a fresh interpreter from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def tiny_config(output_dir, **overrides):
    """An HfGRPOConfig for tiny-trainer tests: small batches, a few steps, no saving, no trackers, CPU-friendly."""
    from hf_grpo.config import HfGRPOConfig

    values = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=12,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        max_steps=3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
        bf16=False,
    )
    values.update(overrides)
    return HfGRPOConfig(**values)


def tiny_lora():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory):
    """A warm-started tiny model on disk: the server loads it, the trainer loads it and adds LoRA."""
    from hf_grpo.tiny import build_model, build_tokenizer, warm_start

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, steps=60)
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random-init tiny model and tokenizer saved to disk (for servers and evaluators that load from a path)."""
    from hf_grpo.tiny import build_tiny

    path = tmp_path_factory.mktemp("tiny-model")
    model, tokenizer = build_tiny(seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
