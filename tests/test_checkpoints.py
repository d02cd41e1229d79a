"""Checkpoint completeness: the manifest written after every process has saved, and which
checkpoint ``resume_from_checkpoint`` takes when the newest one is incomplete, damaged or from another process count.
A real launch signalled mid-checkpoint, whose resume skips the half-written checkpoint: tests/test_launch_resume.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from hf_grpo.training.checkpoints import MANIFEST, CheckpointError, newest_complete, problem, resolve_resume

from .helpers.common import run_module
from .helpers.trainers import make_trainer


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A real 3-step dynamic-sampling run that saved checkpoint-1, -2 and -3 (a single process)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    trainer = make_trainer(
        out, save_strategy="steps", save_steps=1, dynamic_sampling=True, dynamic_sampling_exhausted="fill"
    )
    trainer.train()
    return out


@pytest.fixture
def run_dir(saved_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy)
    return copy


def test_every_saved_checkpoint_has_a_manifest_listing_each_process_file(saved_run):
    for step in (1, 2, 3):
        folder = saved_run / f"checkpoint-{step}"
        manifest = json.loads((folder / MANIFEST).read_text())
        assert manifest["num_processes"] == 1 and manifest["dynamic_sampling"] is True
        assert manifest["prompt_selection"] is manifest["overlap"] is manifest["mid_cycle"] is False
        # transformers' files and ours, each with its size on disk
        for name in ("trainer_state.json", "optimizer.pt", "rng_state.pth", "hf_grpo_state_rank0.json"):
            assert manifest["files"][name] == (folder / name).stat().st_size, name
        assert "adapter_model.safetensors" in manifest["files"]
        assert problem(folder, 1) is None


class Killed(BaseException):
    """Stands in for a SIGKILL: nothing after it runs (no handler catches a BaseException that is not an Exception)."""


def test_a_save_killed_before_it_completes_keeps_the_previous_checkpoint_with_save_total_limit_1(
    tmp_path, monkeypatch
):
    """With save_total_limit 1 transformers deleted checkpoint-1 inside its _save_checkpoint of
    checkpoint-2, before hf_grpo marked checkpoint-2 complete: a kill in between left nothing to resume from, and
    `resume auto` started again from step 0. Now the rotation runs once checkpoint-2 is complete."""
    from hf_grpo.training import trainer as trainer_module

    out = tmp_path / "run"
    real = trainer_module.write_manifest

    def killed_at_step_2(folder, *args, **kwargs):
        if str(folder).endswith("checkpoint-2"):
            raise Killed
        real(folder, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "write_manifest", killed_at_step_2)
    trainer = make_trainer(out, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=1)
    with pytest.raises(Killed):
        trainer.train()
    assert problem(out / "checkpoint-1", 1) is None  # complete, with its adapter
    assert resolve_resume("auto", str(out), 1) == str(out / "checkpoint-1")
    monkeypatch.setattr(trainer_module, "write_manifest", real)
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-1"))  # and the limit still holds afterwards
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]


def test_auto_skips_a_checkpoint_stopped_mid_write_and_says_so(run_dir, caplog):
    (run_dir / "checkpoint-3" / MANIFEST).unlink()  # the state a kill between the first and the last file leaves
    (run_dir / "checkpoint-3" / "trainer_state.json").unlink()
    with caplog.at_level(logging.INFO, logger="hf_grpo.training.checkpoints"):
        assert resolve_resume("auto", str(run_dir), 1) == str(run_dir / "checkpoint-2")
    assert "skipping" in caplog.text and "checkpoint-3" in caplog.text and MANIFEST in caplog.text


@pytest.mark.parametrize("name", ["optimizer.pt", "adapter_model.safetensors", "hf_grpo_pool_rank0.safetensors"])
def test_a_truncated_file_is_named_and_the_previous_good_checkpoint_offered(run_dir, name):
    damaged = run_dir / "checkpoint-3" / name
    damaged.write_bytes(damaged.read_bytes()[:10])
    assert newest_complete(run_dir, 1)[0] == run_dir / "checkpoint-2"
    with pytest.raises(CheckpointError) as info:
        resolve_resume(str(run_dir / "checkpoint-3"), str(run_dir), 1)
    message = str(info.value)
    assert str(damaged) in message and "damaged" in message and str(run_dir / "checkpoint-2") in message


def test_a_missing_process_file_is_named(run_dir):
    (run_dir / "checkpoint-2" / "hf_grpo_state_rank0.json").unlink()
    assert "hf_grpo_state_rank0.json is missing" in problem(run_dir / "checkpoint-2", 1)


def test_a_dynamic_sampling_checkpoint_resumes_only_on_as_many_processes(run_dir):
    why = problem(run_dir / "checkpoint-3", 2)
    assert "1 training processes" in why and "num_processes: 1" in why
    found, skipped = newest_complete(run_dir, 2)
    assert found is None and sorted(p.name for p in skipped) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert problem(run_dir / "checkpoint-3", 1) is None


def test_auto_over_checkpoints_it_cannot_use_stops_instead_of_starting_over(run_dir):
    """`resume auto` over checkpoints it could not use (all incomplete, or another process count) warned
    and trained from step 0, overwriting them; now it stops naming why and the ways out."""
    with pytest.raises(CheckpointError, match=r"none can be resumed from .*checkpoint-3.*num_processes: 1.*delete"):
        resolve_resume("auto", str(run_dir), 2)  # a 1-process run's dynamic-sampling checkpoints, 2 processes
    for folder in run_dir.glob("checkpoint-*"):
        (folder / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=f"holds 3 checkpoint.*{MANIFEST}"):
        resolve_resume("auto", str(run_dir), 1)
    assert resolve_resume("auto", str(run_dir / "nothing-here"), 1) is None  # no checkpoint at all: a fresh start


def test_an_explicit_checkpoint_from_another_program_is_refused(run_dir):
    """It was taken with a warning, loaded, and ended in a traceback (tests/test_run_guard.py: from the command line)."""
    (run_dir / "checkpoint-2" / MANIFEST).unlink()  # what stock transformers writes: trainer_state.json, no manifest
    with pytest.raises(CheckpointError, match=f"checkpoint-2 has no {MANIFEST}: hf_grpo did not write it"):
        resolve_resume(str(run_dir / "checkpoint-2"), str(run_dir), 1)


def test_the_cli_refuses_a_damaged_checkpoint_before_loading_anything(run_dir):
    damaged = run_dir / "checkpoint-3" / "optimizer.pt"
    damaged.write_bytes(b"")
    result = run_module(
        "hf_grpo.train", "--output_dir", str(run_dir), "--resume_from_checkpoint", str(run_dir / "checkpoint-3"),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(errors) == 1 and str(damaged) in errors[0] and "checkpoint-2" in errors[0]
    assert "Traceback" not in result.stderr and "warm" not in result.stderr.lower()


def test_keep_best_ranks_keeps_the_newest_unranked_and_drops_older_unranked(tmp_path):
    """A checkpoint without a task evaluation no longer stops the run; it is kept unranked while it is
    the newest (to resume from) and deleted with the ranked-out ones after that."""
    from hf_grpo.training.checkpoints import SCORES_FILE, keep_best

    def save(step: int, score):
        (tmp_path / f"checkpoint-{step}").mkdir()
        return keep_best(tmp_path, f"checkpoint-{step}", score, keep=1)

    assert save(2, 0.5) == {"checkpoint-2": 0.5}
    assert save(3, None) == {"checkpoint-2": 0.5, "checkpoint-3": None}  # the last step, not evaluated
    # checkpoint-3 was unranked and is no longer the newest; checkpoint-4 ranks below the best 1 but is the newest:
    # kept to resume from (deleting it would send `resume auto` back to the peak step, retraining what followed)
    assert save(4, 0.25) == {"checkpoint-2": 0.5, "checkpoint-4": 0.25}
    assert save(6, 0.75) == {"checkpoint-6": 0.75}
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6"]
    assert json.loads((tmp_path / SCORES_FILE).read_text()) == {"checkpoint-6": 0.75}
    assert not list(tmp_path.glob("*.tmp"))


def test_checkpoint_scores_are_replaced_whole_never_rewritten_in_place(tmp_path, monkeypatch):
    """Rank 0 rewrote ``checkpoint_scores.json`` in place (``open(path, "w")``) while other ranks read
    it. Now only rank 0 touches it (``_save_checkpoint`` calls ``keep_best`` under ``should_save``) and it writes a
    temporary file that ``os.replace`` puts in place, so a reader sees the old ranking or the new one, never half."""
    import builtins
    import io

    from hf_grpo.training.checkpoints import SCORES_FILE, keep_best

    opened_for_writing, replaced = [], []
    real_open, real_io_open, real_replace = builtins.open, io.open, os.replace

    def spy(opener):
        def open_(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax+"):
                opened_for_writing.append(Path(file).name)
            return opener(file, mode, *args, **kwargs)

        return open_

    monkeypatch.setattr(builtins, "open", spy(real_open))
    monkeypatch.setattr(io, "open", spy(real_io_open))
    monkeypatch.setattr(
        os, "replace", lambda a, b: (replaced.append((Path(a).name, Path(b).name)), real_replace(a, b))
    )
    for step, score in ((2, 0.5), (4, 0.75)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        keep_best(tmp_path, f"checkpoint-{step}", score, keep=1)
    assert SCORES_FILE not in opened_for_writing and opened_for_writing, opened_for_writing
    assert replaced == [(name, SCORES_FILE) for name in opened_for_writing]


def test_a_checkpoint_path_with_a_tilde_is_expanded(run_dir, monkeypatch):
    """`resume_from_checkpoint: ~/...` was refused, its message naming the same checkpoint as the
    newest complete one."""
    monkeypatch.setenv("HOME", str(run_dir.parent))
    resumed = resolve_resume(f"~/{run_dir.name}/checkpoint-3", str(run_dir), 1)
    assert resumed == str(run_dir / "checkpoint-3")


def test_a_checkpoint_keeps_the_recipe_it_was_trained_with_and_says_when_it_is_finished(tmp_path):
    """The resume compares this recipe (listed in the manifest, so checked like every file) with the
    current one, and a checkpoint at max_steps is a finished run."""
    from hf_grpo.training.checkpoints import finished_step, recipe_changes, saved_recipe_path, write_manifest

    (tmp_path / "recipe.yaml").write_text("lora_r: 16\n")
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    write_manifest(folder, 1, False)
    (tmp_path / "recipe.yaml").write_text("lora_r: 8\n")  # a later run's recipe: the checkpoint keeps its own
    assert (
        saved_recipe_path(folder) == folder / "recipe.yaml"
        and "recipe.yaml" in json.loads((folder / MANIFEST).read_text())["files"]
    )
    assert (folder / "recipe.yaml").read_text() == "lora_r: 16\n"
    assert finished_step(folder, 2) == 2 and finished_step(folder, 3) is None and finished_step(folder, -1) is None
    fixed, other = recipe_changes(
        {"lora_r": 16, "learning_rate": 0.002, "resume_from_checkpoint": None},
        {"lora_r": 8, "resume_from_checkpoint": "auto", "use_peft": True},
        {"learning_rate": 0.001, "use_peft": True},
    )
    assert fixed == {"lora_r": (16, 8)} and other == {"learning_rate": (0.002, 0.001)}


def test_the_tiny_models_seed_and_warm_start_fix_what_a_checkpoint_resumes():
    """The tiny model is built and warm-started from the seed, so a checkpoint resumed with another seed or
    warm start put its adapter on another base model, with only a warning; for a real model the seed is free."""
    from hf_grpo.training.checkpoints import recipe_changes

    saved, defaults = {"model_name_or_path": "tiny", "seed": 0, "warm_start_steps": 300}, {"seed": 42}
    fixed, _ = recipe_changes(saved, {**saved, "seed": 1, "warm_start_steps": 100}, defaults)
    assert fixed == {"seed": (0, 1), "warm_start_steps": (300, 100)}
    real = {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "seed": 0}
    fixed, other = recipe_changes(real, {**real, "seed": 1}, defaults)
    assert fixed == {} and other == {"seed": (0, 1)}


def test_a_weights_only_checkpoint_is_resumed_with_a_warning(run_dir, caplog):
    """A `save_only_model: true` checkpoint (no optimizer, scheduler or RNG state) was resumed as if exact,
    with no word said; the losses then differ from an uninterrupted run."""
    for name in ("optimizer.pt", "scheduler.pt"):
        (run_dir / "checkpoint-3" / name).unlink()
    manifest = json.loads((run_dir / "checkpoint-3" / MANIFEST).read_text())
    for name in ("optimizer.pt", "scheduler.pt"):
        manifest["files"].pop(name)  # as save_only_model writes it: the files were never there
    (run_dir / "checkpoint-3" / MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="hf_grpo.training.checkpoints"):
        assert resolve_resume("auto", str(run_dir), 1) == str(run_dir / "checkpoint-3")
    assert "no optimizer.pt or scheduler.pt (saved with save_only_model: true)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_grpo.training.checkpoints"):
        assert resolve_resume(str(run_dir / "checkpoint-2"), str(run_dir), 1) == str(run_dir / "checkpoint-2")
    assert "save_only_model" not in caplog.text  # a full checkpoint resumes exactly, with no warning


def test_a_node_where_no_process_wrote_gets_a_manifest_that_names_what_it_lacks(tmp_path):
    """Two nodes without a shared disk and ``save_only_model: true``: node 1's processes wrote no file, so
    ``checkpoint-N`` did not exist there and ``write_manifest`` died with FileNotFoundError mid-save. Now node 1 gets
    the folder with the manifest alone, and its checkpoint is incomplete there (a resume stops naming the file)."""
    from hf_grpo.training.checkpoints import listing, write_manifest

    node0, node1 = tmp_path / "node0" / "checkpoint-2", tmp_path / "node1" / "checkpoint-2"
    node0.mkdir(parents=True)
    (node0 / "adapter_model.safetensors").write_bytes(b"x" * 8)
    (tmp_path / "node1").mkdir()
    seen = [listing(node0), listing(node1)]  # process 0 on node 0, process 1 on node 1: nothing there
    assert seen[1] == {}
    for folder in (node0, node1):
        write_manifest(folder, 2, False, seen)
    assert problem(node0, 2) is None
    assert problem(node1, 2) == f"{node1 / 'adapter_model.safetensors'} is missing"


def test_a_checkpoint_saved_inside_a_generation_cycle_on_another_process_count_says_its_batch_is_generated_anew(
    tmp_path,
):
    """TRL's buffered generation batch is per process: the manifest records it, and a resume on another process count
    (which dynamic sampling's groups refuse) is told before loading that the batch is generated anew, not exact."""
    from hf_grpo.training.checkpoints import sampling_changes, write_manifest

    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    write_manifest(folder, 2, False, mid_cycle=True)
    assert json.loads((folder / MANIFEST).read_text())["mid_cycle"] is True
    assert problem(folder, 1) is None and sampling_changes(folder, {}, 2) == []
    (said,) = sampling_changes(folder, {}, 1)
    assert "inside a generation cycle by 2 training processes and this run has 1" in said
    assert "generated anew" in said and "not continue exactly" in said
    write_manifest(folder, 2, False)  # at a cycle's start: nothing to say
    assert sampling_changes(folder, {}, 1) == []
