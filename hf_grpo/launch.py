"""Process layout: which accelerate config a recipe uses, how many training processes it gets, and the command.

``accelerate_config`` in a recipe is a name from ``accelerate_configs/`` (``ddp``, ``zero2``, ``zero2_offload``,
``zero3``, ``fsdp2``, ``cpu``, ``multinode``) or a path to an accelerate YAML file. ``num_processes`` overrides the
config's process count (the same thing ``accelerate launch --num_processes`` does).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml


PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass
class LaunchArguments:
    """
    Launch options.

    Args:
        accelerate_config (`str`, *optional*):
            Name of a config in `accelerate_configs/` (`ddp`, `zero2`, `zero2_offload`, `zero3`, `fsdp2`, `cpu`,
            `multinode`) or a path to an accelerate YAML file.
        num_processes (`int`, *optional*):
            Training processes in total (all machines); overrides the accelerate config's `num_processes`.
        num_machines (`int`, *optional*):
            Machines; overrides the accelerate config's `num_machines`.
    """

    accelerate_config: str | None = field(
        default=None, metadata={"help": "Name in accelerate_configs/ or path to an accelerate YAML file."}
    )
    num_processes: int | None = field(default=None, metadata={"help": "Training processes in total."})
    num_machines: int | None = field(default=None, metadata={"help": "Number of machines."})


def shipped_dir(name: str) -> Path:
    """A top-level folder shipped with the project (``recipes``, ``accelerate_configs``).

    A wheel carries it inside the package (``hf_grpo/recipes``); a source checkout has it next to the package.
    """
    for candidate in (PACKAGE_DIR / name, PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the shipped {name}/ folder next to {PACKAGE_DIR}")


def resolve_accelerate_config(value: str, base_dir: Path | None = None) -> Path:
    """Path of the accelerate config a recipe names; raises FileNotFoundError with the choices when absent."""
    candidates = [Path(value).expanduser()]
    if base_dir is not None:
        candidates.append(base_dir / value)
    if not value.endswith((".yaml", ".yml")):
        candidates.append(shipped_dir("accelerate_configs") / f"{value}.yaml")
    for path in candidates:
        if path.is_file():
            return path
    names = sorted(p.stem for p in shipped_dir("accelerate_configs").glob("*.yaml"))
    raise FileNotFoundError(f"accelerate_config: {value!r} is neither a file nor one of {names}")


def read_accelerate_config(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f) or {}


@dataclass
class Layout:
    """Resolved process layout of a run."""

    num_processes: int
    num_machines: int
    distributed_type: str
    accelerate_config: Path | None
    zero_stage: int | None = None
    offload_optimizer: str | None = None

    def describe(self) -> str:
        engine = self.distributed_type
        if self.zero_stage is not None:
            engine += f" ZeRO-{self.zero_stage}"
            if self.offload_optimizer not in (None, "none"):
                engine += f" (optimizer offload: {self.offload_optimizer})"
        per_machine = self.num_processes // max(self.num_machines, 1)
        return (
            f"{self.num_processes} training process(es) on {self.num_machines} machine(s) "
            f"({per_machine} per machine), {engine}"
        )


def resolve_layout(args: LaunchArguments, base_dir: Path | None = None) -> Layout:
    """Process layout from the accelerate config, the recipe's overrides, and (inside a launch) the environment."""
    config, path = {}, None
    if args.accelerate_config:
        path = resolve_accelerate_config(args.accelerate_config, base_dir)
        config = read_accelerate_config(path)
    ds = config.get("deepspeed_config") or {}
    num_processes = args.num_processes or config.get("num_processes")
    if num_processes is None:
        num_processes = int(os.environ.get("WORLD_SIZE", "1"))
    return Layout(
        num_processes=int(num_processes),
        num_machines=int(args.num_machines or config.get("num_machines", 1)),
        distributed_type=str(config.get("distributed_type", "NO" if num_processes == 1 else "MULTI_GPU")),
        accelerate_config=path,
        zero_stage=ds.get("zero_stage"),
        offload_optimizer=ds.get("offload_optimizer_device"),
    )


def accelerate_command(layout: Layout, recipe_args: list[str]) -> list[str]:
    """The ``accelerate launch`` command that runs this recipe with its layout."""
    cmd = ["accelerate", "launch"]
    if layout.accelerate_config is not None:
        cmd += ["--config_file", str(layout.accelerate_config)]
    cmd += ["--num_processes", str(layout.num_processes), "--num_machines", str(layout.num_machines)]
    return cmd + ["-m", "hf_grpo.train", *recipe_args]


def format_command(cmd: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in cmd)
