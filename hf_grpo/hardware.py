"""What this machine can run, checked before any model loads.

A recipe written for GPUs (bf16 mixed precision, FlashAttention, vLLM, 8 processes) used to load its model on a
machine without them and then die with a library's traceback, or worse, run something else: on a CPU machine an
FSDP config silently trained plain data parallel (accelerate has no FSDP without a GPU). ``hardware_problems`` lists
every such mismatch as a message naming the setting and the fix; ``hf_grpo.recipe`` turns them into exit code 2.

``CPU_SETTINGS`` is the one table of settings a CPU cannot run and what a miniature runs instead
(``hf_grpo.miniature`` applies it and prints each replacement).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from .generation.vllm_install import NO_VLLM, VLLMInstall, find_vllm


MINIATURE_HINT = "or try the recipe on this machine in miniature: --miniature"


@dataclass(frozen=True)
class Machine:
    cuda_devices: int
    bf16: bool  # a CUDA device with bf16
    packages: frozenset[str]  # of the optional ones below that are importable
    vllm: VLLMInstall = NO_VLLM  # which vLLM distribution is installed (hf_grpo.generation.vllm_install)

    def has(self, package: str) -> bool:
        return package in self.packages


OPTIONAL_PACKAGES = ("deepspeed", "vllm", "flash_attn", "bitsandbytes", "liger_kernel")


@cache
def this_machine() -> Machine:
    import torch

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Machine(
        cuda_devices=cuda,
        bf16=bool(cuda) and torch.cuda.is_bf16_supported(),
        packages=frozenset(p for p in OPTIONAL_PACKAGES if importlib.util.find_spec(p) is not None),
        vllm=find_vllm(),
    )


@dataclass(frozen=True)
class CpuSetting:
    """A recipe value a CPU cannot run, and what a miniature runs instead."""

    key: str
    applies: Callable[[Any], bool]
    cpu_value: Any
    reason: str
    error: bool = True  # False: legal on a CPU (only slow or numerically different); a miniature still maps it


CPU_SETTINGS = (
    CpuSetting("bf16", lambda v: v is True, False, "bf16 mixed precision needs a CUDA GPU with bf16"),
    CpuSetting("fp16", lambda v: v is True, False, "fp16 mixed precision needs a CUDA GPU"),
    CpuSetting(
        "dtype",
        lambda v: v in ("bfloat16", "float16"),
        "float32",
        "half-precision weights compute slowly on a CPU, and DeepSpeed's bf16 mode needs a GPU",
        error=False,
    ),
    CpuSetting(
        "attn_implementation",
        lambda v: isinstance(v, str) and "flash" in v,
        "sdpa",
        "FlashAttention kernels run only on CUDA GPUs",
    ),
    CpuSetting("load_in_4bit", lambda v: v is True, False, "bitsandbytes quantization runs only on CUDA GPUs"),
    CpuSetting("load_in_8bit", lambda v: v is True, False, "bitsandbytes quantization runs only on CUDA GPUs"),
    CpuSetting("use_liger_kernel", lambda v: v is True, False, "Liger's Triton kernels need a GPU"),
    CpuSetting(
        "optim",
        lambda v: isinstance(v, str) and any(t in v for t in ("bnb", "8bit", "paged")),
        "adamw_torch",
        "bitsandbytes optimizers run only on CUDA GPUs",
    ),
)
# accelerate settings (the config file, or `accelerate launch` flags) a CPU cannot run
CPU_MIXED_PRECISION = "no"


def auto_backend(generation: dict, machine: Machine | None = None) -> tuple[dict, str | None]:
    """The ``generation:`` section with ``backend: auto`` resolved for this machine, and why (None: not ``auto``).

    ``vllm_server`` where a server can run beside training: vLLM's CPU build on a machine without GPUs, a CUDA build
    on one with at least two (the GPU count is checked against the layout later). Otherwise ``transformers``, and
    the keys that only a server uses are dropped (``overlap``, ``cpus``), so the recipe stays valid.
    """
    if generation.get("backend") != "auto":
        return generation, None
    machine = machine or this_machine()
    installed = machine.vllm
    if machine.cuda_devices == 0 and installed.runs_on_cpu:
        return {**generation, "backend": "vllm_server"}, f"auto: {installed.describe()} serves on this CPU"
    if machine.cuda_devices >= 2 and installed.distribution == "vllm" and installed.problem is None:
        return {
            **generation,
            "backend": "vllm_server",
        }, f"auto: {installed.describe()} and {machine.cuda_devices} GPUs"
    why = installed.describe() if installed.problem or installed.distribution else "vLLM is not installed"
    if installed.distribution is None and machine.cuda_devices == 0:
        why += " (python -m hf_grpo.generation.vllm_install installs its CPU build)"
    elif installed.distribution is not None and installed.problem is None:
        why = f"{why}, and this machine has {machine.cuda_devices} GPU(s)"
    dropped = {k: v for k, v in generation.items() if k not in SERVER_ONLY_KEYS}
    return {**dropped, "backend": "transformers"}, f"auto: {why}: in-process generation (transformers)"


SERVER_ONLY_KEYS = ("overlap", "cpus")  # meaningless without a vLLM server: auto drops them when it chooses none


def accelerate_mixed_precision(config_value: str | None) -> str | None:
    """The mixed precision this process runs with: accelerate's environment inside a launch, else the config's."""
    return os.environ.get("ACCELERATE_MIXED_PRECISION") or config_value


def hardware_problems(
    values: dict, defaults: dict, layout, generation, machine: Machine | None = None, vllm_standin: bool = False
) -> list[str]:
    """Every way this machine cannot run the recipe as written; each message names the setting and the fix.

    ``values`` are the recipe's explicit keys, ``defaults`` the defaults of the others; ``layout`` is the resolved
    ``hf_grpo.process_layout.Layout`` and ``generation`` the ``GenerationArguments``. ``vllm_standin``: a miniature, whose
    CPU stand-ins take the place of vLLM (its engine and its server).
    """
    machine = machine or this_machine()
    problems: list[str] = []

    def get(key):
        return values.get(key, defaults.get(key))

    distributed = layout.distributed_type
    if distributed == "DEEPSPEED" and not machine.has("deepspeed"):
        problems.append(
            f"accelerate_config {layout.name} uses DeepSpeed, which is not installed here: pip install deepspeed"
        )
    vllm_needed = generation.backend == "vllm_colocate" or (
        generation.backend is None and get("use_vllm") and get("vllm_mode") == "colocate"
    )
    server_full_sync = generation.backend == "vllm_server" and generation.sync_mode(get("use_peft")) == "full"
    if server_full_sync or (generation.backend is None and get("use_vllm") and get("vllm_mode") == "server"):
        vllm_needed = True  # TRL's server client imports vllm and syncs weights over NCCL
    if vllm_standin:
        vllm_needed = False
    if vllm_needed and not machine.has("vllm"):
        problems.append(
            "this generation layout runs TRL's vLLM engine in the training processes, and vllm is not installed "
            "here: pip install -e '.[vllm]' on a GPU machine, or set generation.backend: transformers"
        )

    if generation.cpus is not None and generation.starts_server():
        problems += _pinning_problems(generation.cpus)
    if machine.cuda_devices == 0:
        for setting in CPU_SETTINGS:
            if setting.error and setting.applies(get(setting.key)):
                fix = f"{setting.key}: {_yaml(setting.cpu_value)}"
                problems.append(f"{setting.key}: {_yaml(get(setting.key))}: {setting.reason}; set {fix}")
        precision = accelerate_mixed_precision(layout.mixed_precision)
        if precision in ("bf16", "fp16"):
            source = (
                "accelerate launch runs with"
                if os.environ.get("ACCELERATE_MIXED_PRECISION")
                else f"accelerate_config {layout.name} has"
            )
            problems.append(
                f"{source} mixed_precision {precision}, which needs a GPU; pass --mixed_precision "
                f"{CPU_MIXED_PRECISION} to accelerate launch"
            )
        if distributed == "FSDP":
            problems.append(
                f"accelerate_config {layout.name} is FSDP, which accelerate runs only on GPUs (without one it would "
                "silently train plain data parallel); use a GPU machine, or ddp / zero2 / zero3 on a CPU"
            )
        starts_vllm = generation.starts_server() and generation.serve_command[:1] == ["vllm"]  # not a custom one
        installed = machine.vllm
        lora_sync = generation.sync_mode(get("use_peft")) == "lora"
        if starts_vllm and lora_sync and installed.problem and not vllm_standin:
            problems.append(f"generation.backend vllm_server starts {installed.describe()}")
            starts_vllm = False  # said above, with its fix
        elif starts_vllm and lora_sync and installed.runs_on_cpu:
            starts_vllm = False  # vLLM's CPU build serves here; adapter sync needs nothing more of the trainer
        if vllm_needed or (starts_vllm and not vllm_standin):
            problems.append(
                f"generation.backend {generation.backend or 'vllm (use_vllm)'} needs vLLM on CUDA GPUs and this "
                "machine has none; set generation.backend: transformers"
            )
    else:
        problems += _gpu_problems(get, layout, generation, machine, vllm_standin)
    return problems


def _pinning_problems(cores: list[int]) -> list[str]:
    """``generation.cpus`` on this machine: cores this process may use, at least one left for training, taskset."""
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not usable or shutil.which("taskset") is None:
        return ["generation.cpus pins processes with taskset (util-linux), which this machine lacks: remove it"]
    unknown = sorted(set(cores) - set(usable))
    if unknown:
        return [f"generation.cpus {cores}: cores {unknown} are not among this machine's usable cores {usable}"]
    if not set(usable) - set(cores):
        return [f"generation.cpus {cores} leaves no core for training (usable: {usable}): give the server fewer"]
    return []


def _gpu_problems(get, layout, generation, machine: Machine, vllm_standin: bool) -> list[str]:
    """What a GPU machine lacks for the recipe: enough GPUs for the processes and the server, bf16 support."""
    problems = []
    # a miniature's stand-in server runs on the CPU and takes no GPU
    server = len(generation.server_gpus()) if generation.starts_server() and not vllm_standin else 0
    per_machine = layout.num_processes // max(layout.num_machines, 1)
    if per_machine + server > machine.cuda_devices:
        server_text = f" + {server} vLLM server GPU(s) (generation.gpus)" if server else ""
        problems.append(
            f"{per_machine} training process(es) per machine{server_text} need {per_machine + server} GPUs and "
            f"this machine has {machine.cuda_devices}: set num_processes (or --num_processes) to "
            f"{max(machine.cuda_devices - server, 1)}"
        )
    if get("bf16") is True and not machine.bf16:
        problems.append("bf16: true needs a GPU with bf16 (Ampere or newer); set bf16: false and fp16: true")
    return problems


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
