"""hf_grpo's CPU stand-in for vLLM, and its switch: ``activate()`` makes ``import vllm`` find the fake package.

It emulates ``vllm serve`` (``python -m hf_grpo.vllm_standin MODEL [vllm serve flags]``: ``server``,
``completions``, ``lora``, ``weights``, ``cli``) and the ``vllm`` package (``fake-vllm/vllm``: ``vllm.LLM`` and the
trainer side of the weight transfer), sharing ``engine``, ``validation`` and ``transport``. Importing this package
changes nothing; visibility and ``patch_trl_for_cpu``: docs/vllm_protocol.md.

    from hf_grpo import vllm_standin
    vllm_standin.activate()           # first: before anything imports vllm, trl's GRPOTrainer or hf_grpo.training.trainer
    vllm_standin.patch_trl_for_cpu()  # only for TRL's server mode with full weight sync (VLLMClient.init_communicator)
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


STANDIN_DIR = Path(__file__).resolve().parent / "fake-vllm"  # not importable as a module: see the docstring
STANDIN_VERSION = "0.30.0"
_PATCH_MARK = "__hf_grpo_cpu_patch__"
# A symbol each TRL module binds only when it found vllm at import time.
_TRL_MODULES = {"trl.generation.vllm_client": "get_ip", "trl.generation.vllm_generation": "LLM"}


def is_standin(module: ModuleType | None) -> bool:
    return bool(getattr(module, "__hf_grpo_standin__", False))


def is_active() -> bool:
    """True when ``import vllm`` finds (or found) the stand-in in this process."""
    if "vllm" in sys.modules:
        return is_standin(sys.modules["vllm"])
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().is_relative_to(STANDIN_DIR)


def activate() -> Path:
    """Make ``import vllm`` find the stand-in here and in child processes; returns ``STANDIN_DIR``."""
    loaded = sys.modules.get("vllm")
    if loaded is not None and not is_standin(loaded):
        raise RuntimeError(
            f"a different vllm is already imported ({getattr(loaded, '__file__', loaded)}): activate hf_grpo's CPU "
            "stand-in before anything imports vllm"
        )
    for name, marker in _TRL_MODULES.items():
        module = sys.modules.get(name)
        if module is not None and not hasattr(module, marker):
            raise RuntimeError(
                f"{name} was imported before the vLLM stand-in was activated, and TRL decides at import time "
                "whether vllm exists: call hf_grpo.vllm_standin.activate() before importing trl's "
                "GRPOTrainer or hf_grpo.training.trainer"
            )
    path = str(STANDIN_DIR)
    sys.path[:] = [path, *(p for p in sys.path if p != path)]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != path]
    os.environ["PYTHONPATH"] = os.pathsep.join([path, *parts])
    importlib.invalidate_caches()
    if not is_active():
        raise RuntimeError(f"the vLLM stand-in under {STANDIN_DIR} is not importable (incomplete install?)")
    return STANDIN_DIR


def patch_trl_for_cpu() -> None:
    """Let TRL 1.16's ``VLLMClient.init_communicator`` take a CPU device (see the module docstring); idempotent."""
    if not is_active():
        raise RuntimeError(
            "patch_trl_for_cpu() needs hf_grpo's vLLM stand-in: call activate() first (with a real vLLM the weights "
            "go over NCCL, which needs CUDA)"
        )
    import torch
    import trl
    from trl.generation import vllm_client
    from vllm.distributed.weight_transfer import nccl_common

    if not trl.__version__.startswith("1.16."):
        raise RuntimeError(
            f"patch_trl_for_cpu() is written against TRL 1.16's VLLMClient, found TRL {trl.__version__}"
        )
    if getattr(vllm_client, "open_trainer_endpoint", None) is not nccl_common.trainer_init:
        raise RuntimeError(
            "trl.generation.vllm_client does not use the stand-in's trainer_init: it was imported before "
            "hf_grpo.vllm_standin.activate()"
        )
    client = vllm_client.VLLMClient
    original = client.init_communicator
    if getattr(original, _PATCH_MARK, False):
        return

    @functools.wraps(original)
    def init_communicator(self, device=0):
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if resolved.type == "cpu":
            return original(self, device="cuda")  # passes TRL's CUDA check; no index, so no torch.cuda call
        return original(self, device=device)

    setattr(init_communicator, _PATCH_MARK, True)
    client.init_communicator = init_communicator
