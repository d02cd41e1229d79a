"""What this machine can run, checked before any model loads: ``hardware_problems`` names every setting a recipe
written for GPUs cannot run here (bf16, FlashAttention, vLLM, FSDP without a GPU, more processes than devices) and
its fix; ``hf_grpo.recipe`` turns them into exit code 2. ``CPU_SETTINGS`` is the one table of what a miniature runs
instead on a CPU.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from ..generation.vllm_install import NO_VLLM, VLLMInstall, find_vllm


MINIATURE_HINT = "or try the recipe on this machine in miniature: --miniature"


@dataclass(frozen=True)
class Machine:
    cuda_devices: int
    bf16: bool  # a CUDA device with bf16
    packages: frozenset[str]  # of the optional ones below that are importable
    vllm: VLLMInstall = NO_VLLM  # which vLLM distribution is installed (hf_grpo.generation.vllm_install)
    cpu_cores: int | None = None  # the cores this process may run on; None: not known (no limit checked)

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
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
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
# training processes per core beyond which a machine without a GPU is refused: each process computes on its own
# core(s) (torch_threads), so more only take turns, every collective waits for the slowest, and each holds the model
CPU_PROCESSES_PER_CORE = 2


def auto_backend(generation: dict, machine: Machine | None = None) -> tuple[dict, str | None]:
    """The ``generation:`` section with ``backend: auto`` resolved for this machine, and why (None: not ``auto``).

    ``vllm_server`` where a server on GPUs of its own can run beside training: a CUDA build of vLLM and at least two
    GPUs (the GPU count is checked against the layout later). Otherwise ``transformers``, and the keys that only a
    server uses are dropped (``overlap``, ``cpus``), so the recipe stays valid. On a machine without GPUs that holds
    even where vLLM's CPU build is installed: there in-process generation measured the faster step
    (``CPU_SERVER_SLOWER``); ``backend: vllm_server`` still asks for the server.
    """
    if generation.get("backend") != "auto":
        return generation, None
    machine = machine or this_machine()
    installed = machine.vllm
    if machine.cuda_devices >= 2 and installed.distribution == "vllm" and installed.problem is None:
        return {
            **generation,
            "backend": "vllm_server",
        }, f"auto: {installed.describe()} and {machine.cuda_devices} GPUs"
    why = installed.describe() if installed.problem or installed.distribution else "vLLM is not installed"
    if machine.cuda_devices == 0 and installed.runs_on_cpu:
        why = f"{why} is installed, but {CPU_SERVER_SLOWER}; set generation.backend: vllm_server to use it anyway"
    elif installed.distribution is None and machine.cuda_devices == 0:
        why += " (a vLLM server on a CPU measured slower than in-process generation: docs/results.md, Speed)"
    elif installed.distribution is not None and installed.problem is None:
        why = f"{why}, and this machine has {machine.cuda_devices} GPU(s)"
    dropped = {k: v for k, v in generation.items() if k not in SERVER_ONLY_KEYS}
    return {**dropped, "backend": "transformers"}, f"auto: {why}: in-process generation (transformers)"


# why `auto` keeps generation in-process on a CPU (benchmarks/real_model_speed.py, docs/results.md, Speed)
CPU_SERVER_SLOWER = (
    "on a CPU a vLLM server measured 2-4x slower per step than in-process generation for the real-model recipe "
    "(101.8 s overlapped, 191.9 s synchronous, against 48.1: docs/results.md)"
)


SERVER_ONLY_KEYS = ("overlap", "cpus")  # meaningless without a vLLM server: auto drops them when it chooses none


def accelerate_mixed_precision(config_value: str | None) -> str | None:
    """The mixed precision this process runs with: accelerate's environment inside a launch, else the config's."""
    return os.environ.get("ACCELERATE_MIXED_PRECISION") or config_value


def hardware_problems(
    values: dict, defaults: dict, layout, generation, machine: Machine | None = None, vllm_standin: bool = False
) -> list[str]:
    """Every way this machine cannot run the recipe as written; each message names the setting and the fix.

    ``values`` are the recipe's explicit keys, ``defaults`` the defaults of the others; ``layout`` is the resolved
    ``hf_grpo.launch.processes.Layout`` and ``generation`` the ``GenerationArguments``. ``vllm_standin``: a miniature, whose
    CPU stand-ins take the place of vLLM (its engine and its server). The rules: the tables at the end.
    """
    run = Run(values, defaults, layout, generation, machine or this_machine(), vllm_standin)
    rules = EVERY_MACHINE + (GPU_RULES if run.machine.cuda_devices else CPU_RULES)
    return [problem for rule in rules if (problem := rule(run)) is not None]


@dataclass(frozen=True)
class Run:
    """The recipe (its values over the defaults) and its layout on this machine, with one method per rule below."""

    values: dict
    defaults: dict
    layout: Any  # hf_grpo.launch.processes.Layout
    generation: Any  # hf_grpo.generation.settings.GenerationArguments
    machine: Machine
    vllm_standin: bool  # a miniature: CPU stand-ins take the place of vLLM's engine and server

    def get(self, key: str) -> Any:
        return self.values.get(key, self.defaults.get(key))

    def needs_trl_vllm(self) -> bool:
        """Whether TRL's vLLM runs in the training processes: colocated, or TRL's server client (which imports vllm
        and syncs full weights over NCCL); never in a miniature."""
        backend, mode = self.generation.backend, self.get("vllm_mode")
        trl_vllm = backend is None and bool(self.get("use_vllm")) and mode in ("colocate", "server")
        full_sync = backend == "vllm_server" and self.generation.sync_mode(self.get("use_peft")) == "full"
        return not self.vllm_standin and (backend == "vllm_colocate" or trl_vllm or full_sync)

    def starts_vllm(self) -> bool:
        """Whether the run starts ``vllm serve`` itself (not a custom server command)."""
        return self.generation.starts_server() and self.generation.serve_command[:1] == ["vllm"]

    def syncs_lora(self) -> bool:
        return self.generation.sync_mode(self.get("use_peft")) == "lora"

    def deepspeed_missing(self) -> str | None:
        if self.layout.distributed_type == "DEEPSPEED" and not self.machine.has("deepspeed"):
            name = self.layout.name
            return f"accelerate_config {name} uses DeepSpeed, which is not installed here: pip install deepspeed"
        return None

    def vllm_missing(self) -> str | None:
        if self.needs_trl_vllm() and not self.machine.has("vllm"):
            return (
                "this generation layout runs TRL's vLLM engine in the training processes, and vllm is not installed "
                "here: pip install -e '.[vllm]' on a GPU machine, or set generation.backend: transformers"
            )
        return None

    def pinning_problem(self) -> str | None:
        """``generation.cpus`` on this machine: cores this process may use, at least one left for training, taskset."""
        cores = self.generation.cpus
        if cores is None or not self.generation.starts_server():
            return None
        usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not usable or shutil.which("taskset") is None:
            return "generation.cpus pins processes with taskset (util-linux), which this machine lacks: remove it"
        unknown = sorted(set(cores) - set(usable))
        if unknown:
            return f"generation.cpus {cores}: cores {unknown} are not among this machine's usable cores {usable}"
        if not set(usable) - set(cores):
            return f"generation.cpus {cores} leaves no core for training (usable: {usable}): give the server fewer"
        return None

    def cpu_setting_problem(self, setting: CpuSetting) -> str | None:
        """A value of ``CPU_SETTINGS`` that a CPU cannot run, with the value that it can."""
        value = self.get(setting.key)
        if setting.error and setting.applies(value):
            return f"{setting.key}: {_yaml(value)}: {setting.reason}; set {setting.key}: {_yaml(setting.cpu_value)}"
        return None

    def cpu_mixed_precision(self) -> str | None:
        precision = accelerate_mixed_precision(self.layout.mixed_precision)
        if precision not in ("bf16", "fp16"):
            return None
        launched = os.environ.get("ACCELERATE_MIXED_PRECISION")
        source = "accelerate launch runs with" if launched else f"accelerate_config {self.layout.name} has"
        return (
            f"{source} mixed_precision {precision}, which needs a GPU; pass --mixed_precision "
            f"{CPU_MIXED_PRECISION} to accelerate launch"
        )

    def cpu_fsdp(self) -> str | None:
        if self.layout.distributed_type == "FSDP":
            return (
                f"accelerate_config {self.layout.name} is FSDP, which accelerate runs only on GPUs (without one it "
                "would silently train plain data parallel); use a GPU machine, or ddp / zero2 / zero3 on a CPU"
            )
        return None

    def broken_vllm_server(self) -> str | None:
        """The vLLM server the run starts (adapter sync) cannot start from the installed vLLM (the text says why)."""
        installed = self.machine.vllm
        if self.starts_vllm() and self.syncs_lora() and installed.problem and not self.vllm_standin:
            return f"generation.backend vllm_server starts {installed.describe()}"
        return None

    def cpu_vllm(self) -> str | None:
        """vLLM without CUDA: TRL's engine in training, or a server the run starts, except one syncing adapters from
        a broken install (said by ``broken_vllm_server``) or from vLLM's CPU build (which serves here)."""
        installed = self.machine.vllm
        excused = self.syncs_lora() and (bool(installed.problem) or installed.runs_on_cpu)
        if self.needs_trl_vllm() or (self.starts_vllm() and not excused and not self.vllm_standin):
            return (
                f"generation.backend {self.generation.backend or 'vllm (use_vllm)'} needs vLLM on CUDA GPUs and this "
                "machine has none; set generation.backend: transformers"
            )
        return None

    def per_machine(self) -> int:
        """Training processes on each machine (``hf_grpo.recipe`` checked that they divide evenly)."""
        return self.layout.num_processes // max(self.layout.num_machines, 1)

    def too_many_for_cpu(self) -> str | None:
        """Far more training processes on this machine than it has cores (``CPU_PROCESSES_PER_CORE``)."""
        cores, per_machine = self.machine.cpu_cores, self.per_machine()
        if not cores or per_machine <= CPU_PROCESSES_PER_CORE * cores:
            return None
        machines = self.layout.num_machines
        where, total = (" per machine", f" (all {machines} machines together)") if machines > 1 else ("", "")
        return (
            f"{per_machine} training processes{where} on a machine without a GPU and with {cores} usable CPU "
            f"core(s): more than {CPU_PROCESSES_PER_CORE} per core only take turns; set num_processes (or "
            f"--num_processes){total} to at most {CPU_PROCESSES_PER_CORE * cores * max(machines, 1)}"
        )

    def too_few_gpus(self) -> str | None:
        """Enough GPUs for the processes on this machine and the server (a miniature's stand-in server takes none)."""
        server = len(self.generation.server_gpus()) if self.generation.starts_server() and not self.vllm_standin else 0
        per_machine = self.per_machine()
        gpus = self.machine.cuda_devices
        if per_machine + server <= gpus:
            return None
        server_text = f" + {server} vLLM server GPU(s) (generation.gpus)" if server else ""
        return (
            f"{per_machine} training process(es) per machine{server_text} need {per_machine + server} GPUs and this "
            f"machine has {gpus}: set num_processes (or --num_processes) to {max(gpus - server, 1)}"
        )

    def gpu_without_bf16(self) -> str | None:
        if self.get("bf16") is True and not self.machine.bf16:
            return "bf16: true needs a GPU with bf16 (Ampere or newer); set bf16: false and fp16: true"
        return None


# The rules, in the order their problems are listed: each takes the ``Run`` and returns its problem or None.
EVERY_MACHINE = (Run.deepspeed_missing, Run.vllm_missing, Run.pinning_problem)
CPU_RULES = (
    *(partial(Run.cpu_setting_problem, setting=setting) for setting in CPU_SETTINGS),
    Run.cpu_mixed_precision,
    Run.cpu_fsdp,
    Run.broken_vllm_server,
    Run.cpu_vllm,
    Run.too_many_for_cpu,
)
GPU_RULES = (Run.too_few_gpus, Run.gpu_without_bf16)


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
