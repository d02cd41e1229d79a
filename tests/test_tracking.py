"""Experiment tracking through report_to (wandb offline, trackio local, tensorboard) and best-checkpoint keeping."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import struct
import subprocess
import sys
import types

import pytest

from .helpers.common import REPO


def wandb_records(path):
    """The protobuf records of an offline wandb run file (``run-*.wandb``): wandb's LevelDB-style log, a 7-byte
    header, then 32 KiB blocks of chunks (CRC 4 bytes, length 2, type 1: full, first, middle, last). wandb 0.31 ships
    no Python reader for it (its writer is wandb-core), so the chunks are joined here and parsed with wandb.proto."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, chunks = path.read_bytes(), 7, 32768, []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def wandb_story(path) -> dict:
    """project, history values by key (last one), config keys with their JSON, whether the run exited."""
    story = {"project": None, "history": {}, "config": {}, "exited": False}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            story["project"] = record.run.project
        elif kind == "history":
            story["history"].update(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            )
        elif kind == "config":
            story["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "exit":
            story["exited"] = True
    return story


STORY = ("eval/accuracy_before", "eval/accuracy_after", "eval/gain", "eval/gain_low", "eval/gain_high")


def expected_story(out) -> dict:
    results = json.loads((out / "eval_results.json").read_text())
    before, after, gain = results["before"]["accuracy"], results["after"]["accuracy"], results["gain"]
    return dict(zip(STORY, (before, after, gain["gain"], *gain["ci95"]), strict=True))


@pytest.mark.slow  # a whole run in a subprocess with three trackers
def test_report_to_wandb_trackio_tensorboard_offline(tmp_path):
    """One short run with the three trackers and a held-out evaluation every step but the last (the evaluation after
    training covers that one): each tracker holds the training metrics, eval/accuracy (not train/eval/accuracy), the
    before/after result with the gain's interval, the plot, the resolved recipe, under the project its environment
    variable names."""
    out = tmp_path / "run"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "WANDB_PROJECT": "hf_grpo-wandb",
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "TRACKIO_PROJECT": "hf_grpo-trackio",
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb"),
        "HF_HUB_OFFLINE": "1",
    }
    (tmp_path / "wandb").mkdir()
    cmd = [
        sys.executable, "-m", "hf_grpo.train", "recipes/tiny.yaml", "--output_dir", str(out), "--max_steps", "3",
        "--warm_start_steps", "10", "--per_device_train_batch_size", "16", "--arithmetic_eval_size", "8",
        "--logging_steps", "1", "--task_eval_steps", "1", "--report_to", "[wandb, trackio, tensorboard]",
        "--run_name", "tracking-test",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "could not log the run's results" not in result.stderr, result.stderr[-4000:]
    expected = expected_story(out)
    history = json.loads((out / "training_history.json").read_text())
    assert sorted(r["step"] for r in history if "eval/accuracy" in r) == [1, 2]

    # wandb: the offline run file
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, "expected one offline wandb run"
    story = wandb_story(runs[0])
    assert story["project"] == "hf_grpo-wandb" and story["exited"]
    logged = story["history"]
    assert "train/rewards/gsm8k_correctness/mean" in logged
    assert "eval/accuracy" in logged and "train/eval/accuracy" not in logged
    assert {k: logged[k] for k in STORY} == pytest.approx(expected)
    assert logged["training_curves/_type"] == "image-file"
    assert (runs[0].parent / "files" / logged["training_curves/path"]).is_file()
    assert story["config"]["recipe"]["reward_funcs"] == ["gsm8k_correctness"]
    assert story["config"]["recipe"]["lora_r"] == 16

    # tensorboard: the callback's event file and the story's second one in the same directory
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    assert {"train/reward", "train/accuracy", "train/time/generate", "eval/accuracy"} <= set(tags["scalars"])
    assert "train/eval/accuracy" not in tags["scalars"]
    assert [e.step for e in accumulator.Scalars("eval/accuracy")] == [1, 2]
    assert {k: accumulator.Scalars(k)[-1].value for k in STORY} == pytest.approx(expected)
    assert tags["images"] == ["training_curves"]
    (recipe_text,) = accumulator.Tensors("recipe/text_summary")
    assert b"reward_funcs" in recipe_text.tensor_proto.string_val[0]
    assert b"lora_r: 16" in recipe_text.tensor_proto.string_val[0]

    # trackio: its local SQLite store, one database per project
    assert [p.name for p in (tmp_path / "trackio").glob("*.db")] == ["hf_grpo-trackio.db"]
    with sqlite3.connect(tmp_path / "trackio" / "hf_grpo-trackio.db") as db:
        rows = [json.loads(m) for (m,) in db.execute("SELECT metrics FROM metrics WHERE run_name = 'tracking-test'")]
        (config,) = [
            json.loads(c) for (c,) in db.execute("SELECT config FROM configs WHERE run_name = 'tracking-test'")
        ]
    logged = {k: v for row in rows for k, v in row.items()}
    assert "train/reward" in logged
    assert len([r for r in rows if "eval/accuracy" in r]) == 2 and "train/eval/accuracy" not in logged
    assert {k: logged[k] for k in STORY} == pytest.approx(expected)
    assert logged["training_curves"]["_type"] == "trackio.image"
    assert (tmp_path / "trackio" / "media" / logged["training_curves"]["file_path"]).is_file()
    assert config["recipe"]["reward_funcs"] == ["gsm8k_correctness"] and config["recipe"]["lora_r"] == 16
    assert config["learning_rate"] == 0.002  # the config the callback stored is kept when the story reopens the run


def test_project_precedence_recipe_then_environment_then_default():
    from hf_grpo.monitoring.trackers import project_for

    both = {"WANDB_PROJECT": "w", "TRACKIO_PROJECT": "t"}
    assert project_for("trackio", {"project": "r"}, both) == project_for("wandb", {"project": "r"}, both) == "r"
    assert (project_for("trackio", {}, both), project_for("wandb", {}, both)) == ("t", "w")
    assert project_for("wandb", {}, {"TRACKIO_PROJECT": "t"}) == "t"
    assert project_for("trackio", {}, {"WANDB_PROJECT": "w"}) == "w"
    assert project_for("trackio", {}, {}) == project_for("wandb", {}, {}) == "huggingface"


def test_a_tracker_that_cannot_take_the_story_is_named_in_a_warning(tmp_path, caplog):
    """Each tracker that cannot take the story (no wandb run open, a tensorboard callback whose training never
    started, a trackio run with no name to reopen) gets a warning naming it and the reason; nothing is raised.
    The callbacks stand in for Transformers' (same class names and attributes): importing those takes seconds."""
    from hf_grpo.monitoring.trackers import TrackerSetup
    from hf_grpo.publish.run_result import RunResult

    callbacks = [
        type("WandbCallback", (), {"_wandb": None})(),
        type("TensorBoardCallback", (), {"logging_dir": None})(),
        type("TrackioCallback", (), {"_trackio": None})(),
    ]
    trainer = types.SimpleNamespace(
        callback_handler=types.SimpleNamespace(callbacks=callbacks),
        state=types.SimpleNamespace(global_step=3),
        args=types.SimpleNamespace(run_name=None),
    )
    with caplog.at_level(logging.WARNING, logger="hf_grpo.monitoring.trackers"):
        TrackerSetup(tmp_path).log_story(trainer, RunResult(tmp_path))
    messages = sorted(r.getMessage() for r in caplog.records)
    assert len(messages) == 3, messages
    assert messages[0].startswith("TensorBoardCallback could not log the run's results: RuntimeError")
    assert messages[1].startswith("TrackioCallback could not log the run's results: RuntimeError")
    assert "run_name" in messages[1]
    assert messages[2].startswith("WandbCallback could not log the run's results: RuntimeError: no wandb run")


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
    # the best 2, and the last one whatever its rank: a resumed run continues from where it stopped
    assert set(scores) == {f"checkpoint-{s}" for s in best} | {"checkpoint-4"}
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted(scores)


def test_keep_top_k_keeps_an_unevaluated_last_checkpoint_unranked(tmp_path):
    """Transformers saves at the last step whatever save_steps is; with no task evaluation there, the
    run crashed before writing its adapter and evaluation. Now that checkpoint is kept unranked (to resume from)."""
    from hf_grpo.train import train

    out = tmp_path / "topk-last"
    train(
        "recipes/tiny.yaml",
        output_dir=str(out),
        max_steps=3,
        warm_start_steps=60,
        per_device_train_batch_size=32,
        arithmetic_eval_size=16,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        task_eval_steps=2,
        keep_top_k=1,
        eval_before_after=False,
    )
    scores = json.loads((out / "checkpoint_scores.json").read_text())
    assert scores.keys() == {"checkpoint-2", "checkpoint-3"} and scores["checkpoint-3"] is None
    assert isinstance(scores["checkpoint-2"], float)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert (out / "adapter_model.safetensors").is_file()  # the run reached its end
