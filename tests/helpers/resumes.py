"""What the resume tests compare between a run stopped and resumed and the same run uninterrupted: the complete
checkpoints of a run, the prompts its selection skipped step by step, the final adapter bit for bit, and what each
process's checkpoint file holds (the prompt stream, carried groups, keep digest and reward history)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from hf_grpo.training.checkpoints import MANIFEST


def complete_checkpoints(out: Path) -> list[int]:
    """The steps of ``out``'s checkpoints that hold a manifest (written once every process has saved)."""
    return sorted(int(c.name.split("-")[1]) for c in out.glob("checkpoint-*") if (c / MANIFEST).is_file())


def skipped_by_step(out: Path) -> dict[int, float]:
    """``selection/skipped`` of each logged step of the run in ``out`` (its training_history.json)."""
    history = json.loads((out / "training_history.json").read_text())
    return {r["step"]: r["selection/skipped"] for r in history if "selection/skipped" in r}


def assert_same_adapter(a: Path, b: Path) -> None:
    """The adapters saved in folders ``a`` and ``b`` are equal bit for bit (the same ops in the same order)."""
    first, second = load_file(a / "adapter_model.safetensors"), load_file(b / "adapter_model.safetensors")
    assert first.keys() == second.keys() and first
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0, msg=name)


def process_states(checkpoint: Path, processes: int) -> list[dict]:
    """Each process's ``hf_grpo_state_rank<R>.json`` in ``checkpoint``, in rank order."""
    return [json.loads((checkpoint / f"hf_grpo_state_rank{r}.json").read_text()) for r in range(processes)]
