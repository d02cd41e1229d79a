"""What a checkpoint holds besides weights and optimizer, and a resume that changes it: TRL's generation batch when
the checkpoint falls inside a generation cycle (``steps_per_generation`` or ``num_iterations`` above one optimizer
step), with overlap also the round sent ahead, and the sampling features (dynamic sampling, prompt selection,
overlap) turned on or off since it was saved."""

from __future__ import annotations

import inspect
import json
import logging
import shutil

import pytest
import torch
import trl
from safetensors.torch import load_file

from hf_grpo.generation.overlap import STATE_FILE
from hf_grpo.training.checkpoints import MANIFEST, sampling_changes, write_manifest

from .helpers.overlap_run import make_overlap_trainer, record_generate_calls
from .helpers.trainers import make_trainer, one_torch_thread  # noqa: F401  (an autouse fixture)


SAVE_EVERY_STEP = {"save_strategy": "steps", "save_steps": 1}
FEW_ROUNDS = {"max_generation_batches": 2, "dynamic_sampling_exhausted": "fill"}  # the untrained model rarely varies


@pytest.mark.slow  # four tiny runs in this process (about 40 s)
@pytest.mark.parametrize(
    "cycle",
    [
        {"steps_per_generation": 2, "dynamic_sampling": True, "prompt_selection": True},
        {"num_iterations": 2},
    ],
    ids=["steps_per_generation", "num_iterations"],
)
def test_a_run_resumed_inside_a_generation_cycle_continues_exactly(tmp_path, cycle):
    """Resumed from a checkpoint inside a generation cycle, TRL generated that cycle's batch again (its buffer and
    micro-batch count live in memory only) and every later cycle started one step late: the adapter differed from the
    uninterrupted run's by 2e-2. Now the checkpoint holds the batch and the count, and the adapters are equal."""
    settings = {"max_steps": 4, **SAVE_EVERY_STEP, **FEW_ROUNDS, **cycle}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    make_trainer(straight, **settings).train()
    assert json.loads((straight / "checkpoint-1" / MANIFEST).read_text())["mid_cycle"] is True
    assert (straight / "checkpoint-1" / "hf_grpo_batch_rank0.pt").is_file()
    assert json.loads((straight / "checkpoint-2" / MANIFEST).read_text())["mid_cycle"] is False  # a cycle's start
    assert not (straight / "checkpoint-2" / "hf_grpo_batch_rank0.pt").exists()

    shutil.copytree(straight / "checkpoint-1", resumed / "checkpoint-1")
    make_trainer(resumed, **settings).train(resume_from_checkpoint=str(resumed / "checkpoint-1"))
    a = load_file(straight / "checkpoint-4" / "adapter_model.safetensors")
    b = load_file(resumed / "checkpoint-4" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)  # the same ops in the same order


@pytest.mark.slow  # two runs through the stand-in server in this process (about 20 s)
def test_an_overlapped_run_resumed_inside_a_generation_cycle_continues_exactly(policy_dir, tmp_path):
    """With ``generation.overlap`` (``steps_per_generation 2``, ``max_staleness 2``) checkpoint-1 falls inside a cycle,
    holding TRL's batch besides the next cycle's round, sent ahead: resumed from it, the run trains on the rest of that
    batch and takes the round as sent (nothing is generated for step 2), instead of generating at step 1 and every
    later cycle a step late. Through the stand-in vLLM server, with dynamic sampling on."""
    settings = {"max_steps": 4, "steps_per_generation": 2, "dynamic_sampling": True, **SAVE_EVERY_STEP, **FEW_ROUNDS}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    with make_overlap_trainer(policy_dir, straight, max_staleness=2, **settings) as (trainer, _):
        trainer.train()
    checkpoint = straight / "checkpoint-1"
    assert json.loads((checkpoint / MANIFEST).read_text())["mid_cycle"] is True
    assert (checkpoint / "hf_grpo_batch_rank0.pt").is_file()
    rounds = json.loads((checkpoint / STATE_FILE.format(rank=0)).read_text())["rounds"]
    assert rounds and rounds[0]["step"] == 2, rounds  # the next cycle's round, sent ahead

    shutil.copytree(checkpoint, resumed / "checkpoint-1")
    with make_overlap_trainer(policy_dir, resumed, max_staleness=2, **settings) as (trainer, _):
        calls = record_generate_calls(trainer)
        trainer.train(resume_from_checkpoint=str(resumed / "checkpoint-1"))
    assert trainer.state.global_step == 4
    assert all(c["step"] >= 2 and c["seed_key"] != (2, "overlap-0") for c in calls), calls  # step 2's was sent
    a = load_file(straight / "checkpoint-4" / "adapter_model.safetensors")
    b = load_file(resumed / "checkpoint-4" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)  # the same ops in the same order


def test_trl_keeps_its_generation_batch_as_the_checkpoint_restores_it():
    """``GRPOTrainer._load_generation_batch`` restores TRL's ``_step`` and ``_buffered_inputs``: TRL must still generate
    only when ``_step`` starts a cycle (or nothing is buffered) and train on slice ``_step % steps_per_generation``."""
    source = inspect.getsource(trl.GRPOTrainer._prepare_inputs)
    assert "generate_every = self.args.steps_per_generation * self.num_iterations" in source
    assert "if self._step % generate_every == 0 or self._buffered_inputs is None:" in source
    assert "inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]" in source


def test_a_batch_saved_with_another_cycle_shape_is_generated_anew_with_a_warning(tmp_path, caplog, monkeypatch):
    """A mid-cycle checkpoint resumed with another steps_per_generation: TRL would index its buffer past its end
    (a traceback after the model loaded) or train slices of the wrong size; the batch is generated anew instead. On
    several CPU processes accelerate's device is ``cpu:0``, which ``torch.load``'s map_location does not take."""
    from accelerate import Accelerator

    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    batches = [{"prompt_ids": torch.zeros(16, 3, dtype=torch.long)} for _ in range(2)]
    torch.save({"step": 1, "every": 2, "batches": batches}, checkpoint / "hf_grpo_batch_rank0.pt")

    saved = {"num_processes": 1, "mid_cycle": True}  # the checkpoint's manifest
    same = make_trainer(tmp_path / "same", steps_per_generation=2)
    monkeypatch.setattr(Accelerator, "device", property(lambda self: torch.device("cpu:0")))  # as under gloo
    same._load_generation_batch(str(checkpoint), 0, saved)
    assert same._step == 1 and len(same._buffered_inputs) == 2
    same._load_generation_batch(str(checkpoint), 0, {**saved, "num_processes": 2})  # another count: generated anew
    assert same._step == 0 and same._buffered_inputs is None

    other = make_trainer(tmp_path / "other", steps_per_generation=4)
    other._step, other._buffered_inputs = 3, ["stale"]  # a trainer trained before: a resume starts from the checkpoint
    with caplog.at_level(logging.WARNING, logger="hf_grpo.training.trainer"):
        other._load_generation_batch(str(checkpoint), 0, saved)
    assert other._step == 0 and other._buffered_inputs is None
    assert "another steps_per_generation" in caplog.text and "generated anew" in caplog.text
    other._load_generation_batch(str(checkpoint), 0, {**saved, "mid_cycle": False})  # a cycle's start: TRL generates
    assert other._step == 0 and other._buffered_inputs is None


def checkpoint_saved_with(folder, **features):
    """A complete checkpoint folder whose manifest records ``features``."""
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    write_manifest(folder, 1, features.pop("dynamic_sampling", False), **features)
    return folder


def test_sampling_changes_name_each_feature_turned_on_or_off_and_what_the_resume_does(tmp_path):
    folder = checkpoint_saved_with(tmp_path / "checkpoint-2", dynamic_sampling=True, overlap=True)
    same = {"dynamic_sampling": True, "prompt_selection": False, "overlap": True}
    assert sampling_changes(folder, same, 1) == []
    selection, overlap = sampling_changes(folder, {"dynamic_sampling": True, "prompt_selection": True}, 1)
    assert selection == (
        f"{folder} was saved with prompt_selection false and this run has prompt_selection: true: prompt selection "
        "starts with an empty reward history"
    )
    assert overlap == (
        f"{folder} was saved with overlap true and this run has overlap: false: the rounds it generated ahead are "
        "dropped and generated again"
    )
    (off,) = sampling_changes(folder, {"overlap": True}, 1)
    assert "dynamic_sampling true" in off and "carried groups are dropped" in off
    (folder / MANIFEST).unlink()  # another program's checkpoint holds nothing of ours: nothing to compare
    assert sampling_changes(folder, {"prompt_selection": True}, 1) == []


def test_resume_target_warns_before_loading_when_a_sampling_feature_was_turned_on(tmp_path, caplog):
    """Dynamic sampling or prompt selection turned on since the checkpoint ended in a FileNotFoundError or ValueError
    traceback after the model loaded; now the check before loading says that each starts fresh (overlap: the same
    check, run by tests/test_overlap_resume.py with a server)."""
    from hf_grpo.recipe.load import load_recipe
    from hf_grpo.run.pipeline import resume_target

    folder = checkpoint_saved_with(tmp_path / "run" / "checkpoint-2")
    argv = [
        "recipes/tiny.yaml", "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(folder),
        "--prompt_selection", "true",
    ]  # fmt: skip
    recipe, _ = load_recipe(argv, for_run=False)
    with caplog.at_level(logging.WARNING, logger="hf_grpo"):
        assert resume_target(recipe, 1, lock=False) == str(folder)
    said = caplog.text
    assert "dynamic_sampling false and this run has dynamic_sampling: true: dynamic sampling starts fresh" in said
    assert "prompt_selection false and this run has prompt_selection: true: prompt selection starts" in said
    assert "overlap" not in caplog.text  # unchanged: not named


@pytest.mark.slow  # two tiny runs in this process (about 10 s)
@pytest.mark.parametrize(("saved", "resumed"), [({}, {"prompt_selection": True})], ids=["prompt_selection"])
def test_a_resume_with_a_sampling_feature_turned_on_starts_it_fresh(tmp_path, saved, resumed):
    """The trainer's side of it: the checkpoint holds no state of the feature, and the resumed run trains on (it
    raised ValueError for prompt selection, after the model loaded). Here the checkpoint holds dynamic sampling's
    state without a reward history; one saved without dynamic sampling (FileNotFoundError), resumed with it and prompt
    selection and overlap on: tests/test_overlap_resume.py, from the command line."""
    settings = {**SAVE_EVERY_STEP, **FEW_ROUNDS, "dynamic_sampling": True}
    make_trainer(tmp_path, **{**settings, **saved}, max_steps=1).train()
    trainer = make_trainer(tmp_path, **{**settings, **resumed}, max_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert trainer.state.global_step == 2
    manifest = json.loads((tmp_path / "checkpoint-2" / MANIFEST).read_text())
    assert all(manifest[key] is True for key in resumed)  # saved from now on
