"""SIGTERM of an overlapped run mid-training, then ``--resume_from_checkpoint auto``, reaches
the same final adapter as the same run uninterrupted. Real processes: ``python -m hf_grpo.train`` (the launcher
starts the stand-in vLLM server, then training), with dynamic sampling on (the tiny recipe), so that the checkpoint
holds carried groups and a round sent ahead. Tier 2 (about 2 minutes):

    .venv/bin/python -m pytest -q --tier 2 tests/test_overlap_resume.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from hf_grpo.checkpoints import MANIFEST
from hf_grpo.generation.overlap import STATE_FILE

from .helpers.common import REPO
from .test_generation import COMMON, FIXTURE_SERVE, RUN_MARK, free_port, kill_marked, marked_processes, wait_until


pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

STEPS = 8


def command(policy_dir, out) -> list[str]:
    return [
        sys.executable, "-m", "hf_grpo.train", *COMMON, "--model_name_or_path", str(policy_dir),
        "--output_dir", str(out), "--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps", "1",
        "--eval_before_after", "false", "--task_eval_steps", "0", "--generation.backend", "vllm_server",
        "--generation.serve_command", FIXTURE_SERVE, "--generation.server_timeout", "120",
        "--generation.overlap", "true",
    ]  # fmt: skip


def run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*cmd, "--generation.port", str(free_port())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def complete_checkpoints(out) -> list[int]:
    return sorted(int(c.name.split("-")[1]) for c in out.glob("checkpoint-*") if (c / MANIFEST).is_file())


@pytest.mark.timeout(600)
def test_sigterm_mid_run_then_resume_auto_reaches_the_uninterrupted_adapter(policy_dir, tmp_path):
    mark = f"overlap-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    straight_out, out = tmp_path / "straight", tmp_path / "run"
    try:
        straight = run(command(policy_dir, straight_out), env)
        assert straight.returncode == 0, straight.stderr[-4000:]

        launcher = subprocess.Popen(
            [*command(policy_dir, out), "--generation.port", str(free_port())],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert wait_until(lambda: launcher.poll() is not None or 2 in complete_checkpoints(out), 240)
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 130, launcher.stderr.read()[-3000:]
        assert wait_until(lambda: not marked_processes(mark), 15), marked_processes(mark)
        saved = complete_checkpoints(out)
        assert saved and saved[-1] < STEPS, f"the run was not stopped mid-run: {saved}"
        newest = out / f"checkpoint-{saved[-1]}"
        rounds = json.loads((newest / STATE_FILE.format(rank=0)).read_text())["rounds"]
        assert rounds and rounds[0]["step"] == saved[-1], rounds  # the round sent ahead for the next step

        resumed = run([*command(policy_dir, out), "--resume_from_checkpoint", "auto"], env)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert f"resuming from {newest}" in resumed.stderr, resumed.stderr[-4000:]
    finally:
        kill_marked(mark)
    history = json.loads((out / "training_history.json").read_text())
    assert max(r["step"] for r in history if "reward" in r) == STEPS
    assert all(r["async/staleness_max"] <= 1 for r in history if "async/staleness_max" in r)
    a = load_file(straight_out / "adapter_model.safetensors")
    b = load_file(out / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)  # bitwise: same ops, same order


@pytest.mark.timeout(600)
def test_a_resume_inside_a_generation_cycle_reaches_the_uninterrupted_adapter(policy_dir, tmp_path):
    """Two optimizer steps per generation (``steps_per_generation 2``): checkpoint-1 falls inside a cycle, holding
    TRL's batch besides the round sent ahead; resumed from it, the run trains on the rest of that batch and takes the
    next cycle's round as sent, instead of generating at step 1 and every later cycle a step late."""
    mark = f"overlap-cycle-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    straight_out, out = tmp_path / "straight", tmp_path / "run"
    cycle = ["--max_steps", "4", "--steps_per_generation", "2", "--generation.max_staleness", "2"]
    try:
        straight = run([*command(policy_dir, straight_out), *cycle], env)
        assert straight.returncode == 0, straight.stderr[-4000:]
        checkpoint = straight_out / "checkpoint-1"
        assert json.loads((checkpoint / MANIFEST).read_text())["mid_cycle"] is True
        shutil.copytree(checkpoint, out / "checkpoint-1")
        resumed = run([*command(policy_dir, out), *cycle, "--resume_from_checkpoint", str(out / "checkpoint-1")], env)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
    finally:
        kill_marked(mark)
    a = load_file(straight_out / "adapter_model.safetensors")
    b = load_file(out / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


@pytest.mark.timeout(600)
def test_a_resume_that_turns_sampling_features_on_starts_them_fresh_saying_so_before_loading(policy_dir, tmp_path):
    """A checkpoint saved without overlap, dynamic sampling or prompt selection, resumed with them on, ended in a
    FileNotFoundError traceback after the model loaded; now each starts fresh, said before anything loads."""
    mark = f"overlap-fresh-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    off = ["--generation.overlap", "false", "--dynamic_sampling", "false", "--max_steps", "1"]
    on = ["--dynamic_sampling", "true", "--prompt_selection", "true", "--max_steps", "2"]
    try:
        first = run([*command(policy_dir, out), *off], env)
        assert first.returncode == 0, first.stderr[-4000:]
        resumed = run([*command(policy_dir, out), *on, "--resume_from_checkpoint", "auto"], env)
    finally:
        kill_marked(mark)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-4000:]
    loaded = resumed.stderr.index("training on")  # logged once the trainer (and the model) is built
    for said in (
        "saved with dynamic_sampling false and this run has dynamic_sampling: true: dynamic sampling starts fresh",
        "saved with prompt_selection false and this run has prompt_selection: true: prompt selection starts",
        "saved with overlap false and this run has overlap: true: overlap starts fresh",
    ):
        assert -1 < resumed.stderr.find(said) < loaded, said
    manifest = json.loads((out / "checkpoint-2" / MANIFEST).read_text())
    assert manifest["overlap"] is manifest["dynamic_sampling"] is manifest["prompt_selection"] is True
