"""The peak memory of this process, as the memory plan counts it (``hf_grpo.launch.memory_plan``): on a CUDA GPU
what PyTorch's allocator held at most (``torch.cuda.max_memory_allocated``), on a CPU the peak resident set
(``VmHWM``). A run logs it at its end beside the plan's number."""

from __future__ import annotations

import sys
from pathlib import Path


def peak_memory() -> tuple[int, str] | None:
    """(bytes, what was measured); None where neither can be read."""
    torch = sys.modules.get("torch")  # a process that never imported torch allocated nothing on a GPU
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        return torch.cuda.max_memory_allocated(device), f"torch's max allocated on cuda:{device}"
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024, "this process's peak resident memory (VmHWM)"
    return None
