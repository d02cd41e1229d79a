"""Prompt selection survives SIGTERM: ``python -m hf_grpo.train`` with ``--prompt_selection true`` on 1 process and
on 2 (``--accelerate_config cpu --num_processes 2``, our launcher starting accelerate), stopped by SIGTERM after a
checkpoint in which the reward history has already skipped prompts, then ``--resume_from_checkpoint auto``, ends
with the adapter of the same run uninterrupted, bit for bit. The training set is 64 problems, so prompts come back
within the run and the history decides. Tier 2 (about 4 minutes):

    .venv/bin/python -m pytest -q --tier 2 tests/test_selection_sigterm.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from hf_grpo.checkpoints import MANIFEST

from .helpers.common import REPO
from .test_generation import COMMON, RUN_MARK, kill_marked, marked_processes, wait_until


pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

STEPS = 8


def command(out, processes: int) -> list[str]:
    layout = ["--accelerate_config", "cpu", "--num_processes", str(processes)] if processes > 1 else []
    return [
        sys.executable, "-m", "hf_grpo.train", *COMMON, *layout, "--output_dir", str(out),
        "--per_device_train_batch_size", str(16 // processes), "--prompt_selection", "true",
        "--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps", "1",
        "--eval_before_after", "false", "--task_eval_steps", "0", "--report_to", "none",
    ]  # fmt: skip


def complete_checkpoints(out) -> list[int]:
    return sorted(int(c.name.split("-")[1]) for c in out.glob("checkpoint-*") if (c / MANIFEST).is_file())


def skipped_by_step(out) -> dict[int, float]:
    history = json.loads((out / "training_history.json").read_text())
    return {r["step"]: r["selection/skipped"] for r in history if "selection/skipped" in r}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_then_resume_auto_reaches_the_uninterrupted_adapter(tmp_path, processes):
    mark = f"selection-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    straight_out, out = tmp_path / "straight", tmp_path / "run"
    run = dict(cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    try:
        straight = subprocess.run(command(straight_out, processes), check=False, **run)
        assert straight.returncode == 0, straight.stderr[-4000:]
        skipped = skipped_by_step(straight_out)
        first_skip = min((step for step, n in skipped.items() if n > 0), default=None)
        assert first_skip is not None and first_skip < STEPS - 1, f"selection skipped too late to matter: {skipped}"

        launcher = subprocess.Popen(
            command(out, processes), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        # stop once a checkpoint holds a history that has skipped, and steps remain to be decided by it
        assert wait_until(lambda: launcher.poll() is not None or first_skip + 1 in complete_checkpoints(out), 300)
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 130, launcher.stderr.read()[-3000:]
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
        saved = complete_checkpoints(out)
        assert saved and first_skip < saved[-1] < STEPS, f"not stopped mid-run after a skip: {saved}"

        resumed = subprocess.run([*command(out, processes), "--resume_from_checkpoint", "auto"], check=False, **run)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert f"resuming from {out / f'checkpoint-{saved[-1]}'}" in resumed.stderr, resumed.stderr[-4000:]
    finally:
        kill_marked(mark)
    assert skipped_by_step(out) == skipped, "the resumed run skipped other prompts than the uninterrupted one"
    a = load_file(straight_out / "adapter_model.safetensors")
    b = load_file(out / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)  # bitwise: same ops, same order
