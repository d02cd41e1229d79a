"""What the third tier's runs through real vLLM share (``tests/test_real_vllm.py``, ``tests/test_real_model.py``):
the skip where vLLM's CPU build is not usable, and reading what a run left: its history, its checkpoints, and the
adapters its server log says were loaded and removed.

A launcher appends each server it starts to the run's ``vllm_server.log``: ``server_log(out, offset)`` reads what a
later launch added, from the log's size before it (``log_size``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hf_grpo.generation.vllm_install import find_vllm


REAL_VLLM = pytest.mark.skipif(
    not find_vllm().runs_on_cpu, reason=f"vLLM's CPU build is not usable: {find_vllm().describe()}"
)
# vLLM's own start-up line, in the server's log: the run was served by real vLLM
ENGINE_START = re.compile(r"Initializing a V1 LLM engine \(v0\.\d+")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # in the server command the launcher logs (vLLM's CPU build)


def history(out: Path) -> list[dict]:
    """The training steps' records of ``out/training_history.json`` (written as training goes)."""
    return [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]


def complete_checkpoints(out: Path) -> list[int]:
    """The steps of ``out``'s complete checkpoints (``trainer_state.json`` is written last), ascending."""
    return sorted(int(c.name.split("-")[1]) for c in out.glob("checkpoint-*") if (c / "trainer_state.json").is_file())


def log_size(out: Path) -> int:
    path = out / "vllm_server.log"
    return path.stat().st_size if path.is_file() else 0


def server_log(out: Path, offset: int = 0) -> str:
    """``out/vllm_server.log`` from byte ``offset`` on ("" before the launcher created it)."""
    path = out / "vllm_server.log"
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def loaded_adapters(log: str) -> list[str]:
    return re.findall(r"Loaded new LoRA adapter: name '(policy-\d+)'", log)


def removed_adapters(log: str) -> list[str]:
    return re.findall(r"Removed LoRA adapter: name '(policy-\d+)'", log)


def stopped_server_pid(launcher_log: str) -> int:
    """The pid of the server the launcher stopped, from its log line."""
    return int(re.search(r"stopping the vLLM server \(pid (\d+)\)", launcher_log).group(1))
