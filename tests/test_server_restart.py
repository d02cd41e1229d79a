"""A vLLM server that restarts mid-run no longer ends it. A restarted server has lost the adapter, so the
next request is a 404 "model does not exist": the generator loads the current adapter into it again and sends the
request once more. While it restarts it does not answer at all: ``generation.restart_wait`` says how long to wait."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys

import pytest
import requests
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_grpo.generation.server_generator import ServerGenerator
from hf_grpo.generation.vllm_client import VLLMConnectionError

from .helpers.common import REPO
from .helpers.fake_vllm_server import start_in_thread, start_subprocess
from .helpers.launching import wait_until
from .helpers.reward_scripts import alternating
from .helpers.trainers import make_trainer


@contextlib.contextmanager
def served_trainer(policy_dir, tmp_path, **generator_options):
    """A stand-in server in this process, and a 3-step trainer generating through it: (server, generator, trainer)."""
    server = start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True)
    with server:
        generator = ServerGenerator(
            server.url, tmp_path / "adapters", request_timeout=30, server_timeout=30, **generator_options
        )
        trainer = make_trainer(
            tmp_path,
            model=AutoModelForCausalLM.from_pretrained(policy_dir),
            tokenizer=AutoTokenizer.from_pretrained(policy_dir, padding_side="left"),
            reward_funcs=alternating,
            generator=generator,
            max_steps=3,
        )
        yield server, generator, trainer


def test_a_server_that_lost_the_adapter_gets_it_again_and_the_step_goes_on(policy_dir, tmp_path, caplog):
    served = served_trainer(policy_dir, tmp_path)
    with served as (server, generator, trainer), caplog.at_level(logging.WARNING, logger="hf_grpo"):
        sync = generator.sync

        def sync_then_lose_it(t):  # as if the server restarted between the sync and the step's generation
            synced = sync(t)
            if t.state.global_step == 1:
                requests.post(f"{server.url}/fixture/reset", json={"adapters": True}, timeout=10).raise_for_status()
            return synced

        generator.sync = sync_then_lose_it
        trainer.train()
        adapters = requests.get(f"{server.url}/fixture/adapters", timeout=10).json()["adapters"]
    assert trainer.state.global_step == 3
    assert "no longer serves policy-1: loading policy-1 into it again and sending the request once more" in caplog.text
    assert set(adapters) == {"policy-2"}  # the sync after the reload went on as usual


def test_a_server_that_stops_answering_during_a_sync_is_waited_for(policy_dir, tmp_path, caplog):
    """The server went away while the sync unloaded an old adapter (CI: killed between the load and the unload):
    with restart_wait the sync waits for it and goes on, where it had ended the run."""
    served = served_trainer(policy_dir, tmp_path, restart_wait=60)
    with served as (server, generator, trainer), caplog.at_level(logging.WARNING, logger="hf_grpo"):
        unload, failures = generator.client.unload_lora_adapter, []

        def unload_once_unanswered(name, **kwargs):
            if not failures:
                failures.append(name)
                raise VLLMConnectionError(f"vLLM server at {server.url} did not answer POST /v1/unload_lora_adapter")
            return unload(name, **kwargs)

        generator.client.unload_lora_adapter = unload_once_unanswered
        trainer.train()
        adapters = requests.get(f"{server.url}/fixture/adapters", timeout=10).json()["adapters"]
    assert failures == ["policy-0"] and trainer.state.global_step == 3
    assert "waiting up to 60 s for it to come back (generation.restart_wait)" in caplog.text
    assert set(adapters) == {"policy-2"}  # the unload sent once more went through


WAITING = "waiting up to 120 s for it to come back (generation.restart_wait)"  # the run's line


def recorded_steps(history) -> int:
    """How many records the run's training_history.json holds so far (0 before it is written)."""
    try:
        return len(json.loads(history.read_text() or "[]"))
    except (OSError, ValueError):
        return 0


@pytest.mark.subprocess
@pytest.mark.slow  # two server starts and a whole run
def test_a_run_waits_for_a_restarted_server_with_restart_wait(policy_dir, tmp_path):
    """The server killed after two steps; restarted on the same port once the run said it waits for it (its next
    request found nothing there, and its one retry too), the run goes on to its last step."""
    server = start_subprocess(policy_dir, max_lora_rank=16)
    port = server.url.rsplit(":", 1)[1]
    out, err_path = tmp_path / "run", tmp_path / "stderr.txt"
    command = [
        sys.executable, "-m", "hf_grpo.train", "recipes/tiny.yaml",
        "--model_name_or_path", str(policy_dir), "--output_dir", str(out),
        "--warm_start_steps", "0", "--max_steps", "6", "--logging_steps", "1",
        "--per_device_train_batch_size", "16", "--num_generations", "4", "--max_completion_length", "10",
        "--arithmetic_train_size", "64", "--arithmetic_eval_size", "8", "--eval_before_after", "false",
        "--generation.backend", "vllm_server", "--generation.base_url", server.url,
        "--generation.max_retries", "1", "--generation.restart_wait", "120",
    ]  # fmt: skip
    with open(err_path, "w") as err:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True)
    restarted = None
    try:  # two steps trained, then the server goes away
        assert wait_until(lambda: recorded_steps(out / "training_history.json") >= 2 or proc.poll() is not None, 300)
        assert proc.poll() is None, err_path.read_text()[-3000:]
        server.kill()
        assert wait_until(lambda: WAITING in err_path.read_text() or proc.poll() is not None, 300)
        assert proc.poll() is None, err_path.read_text()[-3000:]  # it waits: the server comes back on its port
        restarted = start_subprocess(policy_dir, max_lora_rank=16, port=int(port))
        proc.wait(timeout=300)
    finally:
        proc.kill()
        server.stop()
        if restarted is not None:
            restarted.stop()
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    # the server came back with no adapter: the request that met it reloaded the current one ("into it again"), or
    # the step's sync loaded the next one
    steps = [r["step"] for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
