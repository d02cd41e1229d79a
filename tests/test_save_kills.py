"""A kill at any moment of a save never loses the last complete checkpoint (``save_total_limit: 1``).

A real tiny run saves ``checkpoint-1``; at the save of ``checkpoint-2`` the test forks once per file operation of that
save (every write-mode open, ``torch.save``, safetensors write, rename, delete, mkdir, transformers' ``rmtree`` of the
older checkpoint) and the child process ends itself with ``os._exit`` right before that operation, or right after a
file write with the file cut to half its size (a write the kill tore). The parent checks what each killed save left:
``resume_from_checkpoint: auto`` must pick a complete checkpoint (``checkpoint-1`` until ``checkpoint-2`` is complete,
``checkpoint-2`` after), and resumes from two of those states train on to the end.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import safetensors.torch
import torch

from hf_grpo.models.tiny import build_tokenizer
from hf_grpo.training import trainer as trainer_module
from hf_grpo.training.checkpoints import MANIFEST, newest_complete, resolve_resume

from .helpers.trainers import arithmetic_train, make_trainer


FINISHED = 99  # a child's exit code when the save ran to its end: no operation was left to kill at
NOT_A_WRITE = 98  # the operation to tear wrote no file (a rename, a delete, a mkdir)
WRITES = ("w", "a", "x", "+")


class KillAt:
    """In a forked child: count the save's file operations; ``os._exit`` at operation ``index`` (``torn``: after it,
    the file it wrote cut to half)."""

    def __init__(self, index: int, torn: bool):
        self.index, self.torn, self.seen, self.busy, self.written = index, torn, 0, False, None

    def operation(self, path=None) -> None:
        if self.busy:
            return
        if self.written is not None:  # the previous operation wrote this file: tear it, then die
            self.die(self.written)
        if self.seen == self.index and not self.torn:
            os._exit(0)
        if self.seen == self.index:
            if path is None:
                os._exit(NOT_A_WRITE)  # nothing to tear
            self.written = path  # torn: once it is written (next operation, or the end of a patched write)
        self.seen += 1

    def die(self, path) -> None:
        self.busy = True
        if os.path.isfile(path):
            os.truncate(path, os.path.getsize(path) // 2)
        os._exit(0)

    def audit(self, event: str, args) -> None:
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            mode, flags = args[1], args[2]
            writes = (
                any(c in mode for c in WRITES) if isinstance(mode, str) else bool(flags & (os.O_WRONLY | os.O_RDWR))
            )
            if writes:
                self.operation(os.fspath(args[0]))
        elif event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree"):
            self.operation()

    def wrap(self, write):
        """A file writer implemented below Python (torch's zip writer, safetensors' Rust), counted as one operation."""

        def counted(obj, path, *args, **kwargs):
            self.operation(os.fspath(path) if isinstance(path, (str, os.PathLike)) else None)
            self.busy = True
            try:
                result = write(obj, path, *args, **kwargs)
            finally:
                self.busy = False
            if self.written is not None:
                self.die(self.written)
            return result

        return counted


def killed_saves(save, trainer, model, trial, out, states) -> None:
    """Fork one child per kill point of ``save``; keep a copy of what each one left in ``states``."""
    before = out.parent / "before-save"
    shutil.copytree(out, before)
    index = 0
    while True:
        for torn in (False, True):
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                try:
                    kill = KillAt(index, torn)
                    sys.addaudithook(kill.audit)
                    torch.save = kill.wrap(torch.save)
                    safetensors.torch.serialize_file = kill.wrap(safetensors.torch.serialize_file)
                    save(trainer, model, trial)
                    if kill.written is not None:  # the last operation wrote a file: tear it
                        kill.die(kill.written)
                finally:
                    os._exit(FINISHED)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            if code == FINISHED:
                assert index > 20, f"only {index} file operations seen in a save: the counting missed most"
                shutil.rmtree(before)
                return
            if code == NOT_A_WRITE:
                continue
            assert code == 0, f"the child killed at operation {index} ended with {code}"
            state = out.parent / f"killed-{index}{'-torn' if torn else ''}"
            shutil.copytree(out, state)
            states.append(state)
            shutil.rmtree(out)
            shutil.copytree(before, out)
        index += 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_no_kill_during_a_save_loses_the_last_complete_checkpoint(tmp_path, monkeypatch):
    torch.set_num_threads(1)  # the forked children use no thread pool of the parent
    out, states = tmp_path / "run", []
    real_save = trainer_module.GRPOTrainer._save_checkpoint

    def save(trainer, model, trial=None):
        if trainer.state.global_step == 2 and not states:
            killed_saves(real_save, trainer, model, trial, out, states)
        real_save(trainer, model, trial)

    monkeypatch.setattr(trainer_module.GRPOTrainer, "_save_checkpoint", save)
    tokenizer, train = build_tokenizer(), arithmetic_train()

    def trainer():
        return make_trainer(
            out, tokenizer=tokenizer, train_dataset=train, max_steps=3, save_strategy="steps", save_steps=1,
            save_total_limit=1, dynamic_sampling=True, dynamic_sampling_exhausted="fill",
        )  # fmt: skip

    trainer().train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]  # the limit held in the real run

    picked = []
    for state in states:
        found, _ = newest_complete(state, 1)
        assert found is not None, f"{state.name}: no complete checkpoint left ({sorted(os.listdir(state))})"
        assert resolve_resume("auto", str(state), 1) == str(found)
        picked.append(found.name)
    # checkpoint-1 until checkpoint-2's manifest is in place, checkpoint-2 from then on, never back
    switch = picked.index("checkpoint-2")
    assert set(picked[:switch]) == {"checkpoint-1"} and set(picked[switch:]) == {"checkpoint-2"}, picked
    mid_rotation = [s for s in states[switch:] if (s / "checkpoint-1").exists()]
    assert mid_rotation, "no kill landed while checkpoint-1 was being deleted"
    assert not (states[switch - 1] / "checkpoint-2" / MANIFEST).exists()

    # resume from the last state before checkpoint-2 was complete and from one halfway through deleting checkpoint-1
    for state, resumed_from in ((states[switch - 1], 1), (mid_rotation[len(mid_rotation) // 2], 2)):
        shutil.rmtree(out)
        shutil.copytree(state, out)
        run = trainer()
        run.train(resume_from_checkpoint=resolve_resume("auto", str(out), 1))
        assert run.state.global_step == 3
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"], state.name
        assert f"checkpoint-{resumed_from}" in str(resolve_resume("auto", str(state), 1))
