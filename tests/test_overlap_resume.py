"""SIGTERM of an overlapped run mid-training, then ``--resume_from_checkpoint auto``, reaches the same final adapter
as the same run uninterrupted; a resume that turns the sampling features on says, before anything loads, that each
starts fresh. Real processes: ``python -m hf_grpo.train`` (the launcher starts the stand-in vLLM server, then
training), with dynamic sampling (the tiny recipe) and prompt selection on, so that the checkpoint holds carried
groups, a reward history and a round sent ahead. A resume inside a generation cycle with a round sent ahead:
tests/test_resume_state.py (the trainer and the stand-in server in this process). Tier 2:

    .venv/bin/python -m pytest -q --tier 2 tests/test_overlap_resume.py
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from hf_grpo.generation.overlap import STATE_FILE
from hf_grpo.train import main
from hf_grpo.training.checkpoints import MANIFEST

from .helpers.common import REPO
from .helpers.launching import COMMON, FIXTURE_SERVE, RUN_MARK, free_port, kill_marked, marked_processes, wait_until
from .helpers.resumes import assert_same_adapter, complete_checkpoints, skipped_by_step


pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

STEPS = 8


def arguments(policy_dir, out) -> list[str]:
    """The run's arguments without its generation section: 1 process, a checkpoint every step."""
    return [
        *COMMON, "--model_name_or_path", str(policy_dir), "--output_dir", str(out), "--max_steps", str(STEPS),
        "--save_strategy", "steps", "--save_steps", "1", "--eval_before_after", "false", "--task_eval_steps", "0",
    ]  # fmt: skip


def command(policy_dir, out) -> list[str]:
    """``python -m hf_grpo.train`` generating on the stand-in server its launcher starts, overlapped."""
    return [
        sys.executable, "-m", "hf_grpo.train", *arguments(policy_dir, out), "--generation.backend", "vllm_server",
        "--generation.serve_command", FIXTURE_SERVE, "--generation.server_timeout", "120",
        "--generation.overlap", "true",
    ]  # fmt: skip


def launch_here(cmd: list[str], mark: str, monkeypatch) -> int:
    """``command``'s launch with the launcher in this process (``hf_grpo.train.main``, as ``python -m`` runs it);
    the server and training process it starts carry the mark, and the server is stopped when it returns."""
    port = free_port()
    monkeypatch.setenv(RUN_MARK, mark)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = main([*cmd[3:], "--generation.port", str(port)])
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
    return code


@pytest.mark.timeout(600)
def test_sigterm_mid_run_then_resume_auto_reaches_the_uninterrupted_adapter(policy_dir, tmp_path, monkeypatch, caplog):
    """Also with prompt selection's reward history in the checkpoint: the resumed run skips the prompts the
    uninterrupted one skipped (on 2 processes, without overlap: tests/test_launch_resume.py)."""
    mark = f"overlap-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    straight_out, out = tmp_path / "straight", tmp_path / "run"
    selection = ["--prompt_selection", "true"]
    caplog.set_level(logging.INFO, logger="hf_grpo")
    try:
        assert launch_here([*command(policy_dir, straight_out), *selection], mark, monkeypatch) == 0
        skipped = skipped_by_step(straight_out)
        assert sum(n for step, n in skipped.items() if step <= 2) > 0, f"selection skipped too late: {skipped}"

        launcher = subprocess.Popen(
            [*command(policy_dir, out), *selection, "--generation.port", str(free_port())],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert wait_until(lambda: launcher.poll() is not None or 2 in complete_checkpoints(out), 240)
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 130, launcher.stderr.read()[-3000:]
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
        saved = complete_checkpoints(out)
        assert saved and saved[-1] < STEPS, f"the run was not stopped mid-run: {saved}"
        newest = out / f"checkpoint-{saved[-1]}"
        rounds = json.loads((newest / STATE_FILE.format(rank=0)).read_text())["rounds"]
        assert rounds and rounds[0]["step"] == saved[-1], rounds  # the round sent ahead for the next step

        caplog.clear()
        resume = [*command(policy_dir, out), *selection, "--resume_from_checkpoint", "auto"]
        assert launch_here(resume, mark, monkeypatch) == 0
        assert f"resuming from {newest}" in caplog.text
    finally:
        kill_marked(mark)
    history = json.loads((out / "training_history.json").read_text())
    assert max(r["step"] for r in history if "reward" in r) == STEPS
    assert all(r["async/staleness_max"] <= 1 for r in history if "async/staleness_max" in r)
    assert skipped_by_step(out) == skipped, "the resumed run skipped other prompts than the uninterrupted one"
    assert_same_adapter(straight_out, out)


@pytest.mark.timeout(600)
def test_a_resume_that_turns_sampling_features_on_starts_them_fresh_saying_so_before_loading(
    policy_dir, tmp_path, monkeypatch, capfd, caplog
):
    """A checkpoint saved without overlap, dynamic sampling or prompt selection, resumed with them on, ended in a
    FileNotFoundError traceback after the model loaded; now each starts fresh, said before anything loads (by the
    launcher before it launches, and by the training process before it builds its trainer). The checkpoint comes from
    a run generating locally (no server): what the resume reads is the same. Both runs' launchers run here."""
    mark = f"overlap-fresh-{os.getpid()}-{time.monotonic_ns()}"
    out = tmp_path / "run"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main([*arguments(policy_dir, out), "--dynamic_sampling", "false", "--max_steps", "1"]) == 0
    capfd.readouterr()
    caplog.clear()
    on = ["--dynamic_sampling", "true", "--prompt_selection", "true", "--max_steps", "2"]
    try:
        code = launch_here([*command(policy_dir, out), *on, "--resume_from_checkpoint", "auto"], mark, monkeypatch)
    finally:
        kill_marked(mark)
    launcher, process = caplog.text, capfd.readouterr().err  # this process's log; the training process's stderr
    assert code == 0 and "Traceback" not in launcher + process, (launcher + process)[-4000:]
    loaded = process.index("training on")  # logged once the trainer (and the model) is built
    for said in (
        "saved with dynamic_sampling false and this run has dynamic_sampling: true: dynamic sampling starts fresh",
        "saved with prompt_selection false and this run has prompt_selection: true: prompt selection starts",
        "saved with overlap false and this run has overlap: true: overlap starts fresh",
    ):
        assert said in launcher and -1 < process.find(said) < loaded, said
    manifest = json.loads((out / "checkpoint-2" / MANIFEST).read_text())
    assert manifest["overlap"] is manifest["dynamic_sampling"] is manifest["prompt_selection"] is True
