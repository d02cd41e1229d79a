"""Experiment tracking through report_to (wandb offline, trackio local, tensorboard) and best-checkpoint keeping."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .conftest import REPO


def test_report_to_wandb_trackio_tensorboard_offline(tmp_path):
    out = tmp_path / "run"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "WANDB_PROJECT": "hf_grpo-test",
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "TRACKIO_PROJECT": "hf_grpo-test",
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb"),
        "HF_HUB_OFFLINE": "1",
    }
    (tmp_path / "wandb").mkdir()
    cmd = [
        sys.executable,
        "-m",
        "hf_grpo.train",
        "recipes/tiny.yaml",
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--warm_start_steps",
        "10",
        "--per_device_train_batch_size",
        "16",
        "--arithmetic_eval_size",
        "8",
        "--logging_steps",
        "1",
        "--report_to",
        "[wandb, trackio, tensorboard]",
        "--run_name",
        "tracking-test",
    ]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]

    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert runs, "no offline wandb run was written"
    assert b"rewards/gsm8k_correctness/mean" in runs[0].read_bytes()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events, "no tensorboard event file"
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert "train/reward" in tags and "train/accuracy" in tags and "train/time/generate" in tags

    databases = list((tmp_path / "trackio").rglob("*.db"))
    assert databases, "trackio wrote no local database"
    assert any(b"reward" in p.read_bytes() for p in databases)


def test_keep_top_k_keeps_the_best_checkpoints_by_held_out_accuracy(tmp_path):
    from hf_grpo.train import train

    out = tmp_path / "topk"
    train(
        "recipes/tiny.yaml",
        output_dir=str(out),
        max_steps=4,
        warm_start_steps=60,
        per_device_train_batch_size=32,
        arithmetic_eval_size=16,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        task_eval_steps=1,
        keep_top_k=2,
        eval_before_after=False,
    )
    scores = json.loads((out / "checkpoint_scores.json").read_text())
    history = json.loads((out / "training_history.json").read_text())
    measured = {r["step"]: r["eval/accuracy"] for r in history if "eval/accuracy" in r}
    assert sorted(measured) == [1, 2, 3, 4]
    best = sorted(measured, key=lambda s: (measured[s], s), reverse=True)[:2]
    assert set(scores) == {f"checkpoint-{s}" for s in best}
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted(scores)
