"""Where an evaluation generates, and how many problems one ``generate`` call takes.

Outside training (``hf-grpo eval``, notebooks) ``choose_device``: ``--device`` when given, else ``cuda`` when torch
sees a GPU, else ``cpu``. Inside a run the trainer's device: ``place_for_generation`` moves a model there that the
trainer has not placed yet (DeepSpeed and FSDP place it when training starts). Batch (``eval_batch_size``): the
recipe's ``per_device_eval_batch_size`` when set, else ``CPU_BATCH`` on a CPU and ``CUDA_BATCH`` on a GPU; a batch
that does not fit the GPU is halved until it does (``evaluation.core.generate``), but where the processes generate in
step (ZeRO-3, FSDP).
"""

from __future__ import annotations

import re

import torch
from transformers import TrainingArguments


DEVICE_FORMAT = re.compile(r"cpu|cuda(?::\d+)?")
CPU_BATCH = 8
CUDA_BATCH = 64


def choose_device(requested: str | None = None) -> torch.device:
    """``requested`` (``cpu``, ``cuda``, ``cuda:N``) when given, else cuda when a CUDA GPU is visible, else cpu.

    Raises ``ValueError`` (one line: the problem and the fix) for a name that is no device, or a GPU this machine does
    not have.
    """
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not DEVICE_FORMAT.fullmatch(requested):
        raise ValueError(f"--device {requested!r} is not a device: pass cpu, cuda or cuda:N (N: a GPU's index)")
    device = torch.device(requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"--device {requested}: torch sees no CUDA GPU on this machine (torch {torch.__version__}); leave "
                "--device out (or pass cpu) to evaluate on the CPU"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"--device {requested}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}; pass one"
            )
    return device


def describe(device: torch.device) -> str:
    """``device`` for a log line: ``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


TRANSFORMERS_DEFAULT = TrainingArguments.__dataclass_fields__["per_device_eval_batch_size"].default  # 8


def eval_batch_size(device: torch.device, configured: int | None = None) -> int:
    """Problems per ``generate`` call on ``device``: ``configured`` when it is not transformers' default, else
    ``CPU_BATCH`` / ``CUDA_BATCH``."""
    if configured and configured != TRANSFORMERS_DEFAULT:
        return configured
    return CUDA_BATCH if device.type == "cuda" else CPU_BATCH


def model_device(model) -> torch.device:
    """The device of ``model``'s first parameter (where its ``generate`` runs)."""
    return next(model.parameters()).device


def place_for_generation(model, device: torch.device, sharded: bool = False) -> torch.device:
    """Move ``model`` to ``device`` if its weights are still on the CPU and ``device`` is an accelerator, unless they
    are ``sharded`` across processes (ZeRO-3, FSDP: each process holds a part); returns where it generates."""
    current = model_device(model)
    if current.type == "cpu" and device.type != "cpu" and not sharded:
        model.to(device)
        return model_device(model)
    return current
