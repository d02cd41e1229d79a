"""What many tests share: the repository root, running a module in a fresh interpreter, a tiny trainer config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


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


def shared_tmp(tmp_path_factory, name: str) -> Path:
    """A folder every -n worker of this session shares (one worker alone: its own), for what is built under a lock."""
    root = tmp_path_factory.getbasetemp()
    path = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / name
    path.mkdir(exist_ok=True)
    return path
