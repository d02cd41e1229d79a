"""Process layout: which accelerate config a recipe uses, how many training processes it gets on how many machines,
which machine this is, and the ``accelerate launch`` command that starts them.

``accelerate_config`` in a recipe is a name from ``accelerate_configs/`` (``ddp``, ``zero2``, ``zero2_offload``,
``zero3``, ``fsdp2``, ``cpu``, ``multinode``) or a path to an accelerate YAML file. ``num_processes`` overrides the
config's process count (the same thing ``accelerate launch --num_processes`` does). With several machines each node
names itself: ``machine_rank`` and ``main_process_ip`` (or ``$NODE_RANK`` and ``$MASTER_ADDR``).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..base.crash_log import port_taken_message


PACKAGE_DIR = Path(__file__).resolve().parent.parent  # hf_grpo/


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
        machine_rank (`int`, *optional*):
            With several machines: which one this is, 0 (the main node) to `num_machines - 1`. Default: `$NODE_RANK`,
            else `$SLURM_NODEID`. Each node runs the same command with its own rank.
        main_process_ip (`str`, *optional*):
            With several machines: the main node's address, as the other nodes reach it. Default: `$MASTER_ADDR`.
        main_process_port (`int`, *optional*):
            The port the main process listens on. Default: `$MASTER_PORT`, else the accelerate config's
            `main_process_port`; else, on one machine, a free port on 127.0.0.1 (two runs on one machine do not
            collide), and with several machines accelerate's 29500.
        gpu_memory_gb (`float`, *optional*):
            Memory of each GPU the memory plan checks the recipe against (`hf_grpo.launch.memory_plan`): the
            hardware the recipe is written for. Default: this machine's GPU.
        memory_check (`str`, *optional*, defaults to `"refuse"`):
            `refuse`: a recipe whose memory plan does not fit exits 2 before the model loads; `warn`: it runs anyway.
    """

    accelerate_config: str | None = field(
        default=None, metadata={"help": "Name in accelerate_configs/ or path to an accelerate YAML file."}
    )
    num_processes: int | None = field(default=None, metadata={"help": "Training processes in total."})
    num_machines: int | None = field(default=None, metadata={"help": "Number of machines."})
    machine_rank: int | None = field(
        default=None, metadata={"help": "This machine's rank, 0 (main) to num_machines - 1; default $NODE_RANK."}
    )
    main_process_ip: str | None = field(
        default=None, metadata={"help": "The main node's address the other nodes reach; default $MASTER_ADDR."}
    )
    main_process_port: int | None = field(
        default=None,
        metadata={"help": "The main process's port; default $MASTER_PORT, else the config's, else a free one."},
    )
    gpu_memory_gb: float | None = field(
        default=None, metadata={"help": "GB of each GPU the memory plan checks against; default this machine's GPU."}
    )
    memory_check: str = field(
        default="refuse",
        metadata={
            "help": "refuse: a recipe the memory plan says cannot fit exits 2; warn: run anyway.",
            "choices": ["refuse", "warn"],
        },
    )


ACCELERATE_MAIN_PORT = 29500  # several machines: the main node's port when nothing names one (accelerate's default)
NODE_RANK_ENV = ("NODE_RANK", "SLURM_NODEID")  # what torchrun's docs and Slurm set on each node


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
    mixed_precision: str | None = None  # the accelerate config's
    machine_rank: int | None = None  # with several machines: this node (command line, else $NODE_RANK)
    main_process_ip: str | None = None  # the main node's address (command line, else $MASTER_ADDR)
    main_process_port: int | None = None  # command line, else $MASTER_PORT, else the config's; None: not named

    @property
    def main_port(self) -> int:
        """The main node's port with several machines: the one named, else accelerate's default."""
        return ACCELERATE_MAIN_PORT if self.main_process_port is None else self.main_process_port

    def names_node(self) -> bool:
        """Whether this node is named: its rank and the main node's address are both known."""
        return self.machine_rank is not None and self.main_process_ip is not None

    @property
    def name(self) -> str | None:
        """The accelerate config's name as a recipe writes it (``zero3``), or None without one."""
        return self.accelerate_config.stem if self.accelerate_config is not None else None

    def describe(self) -> str:
        engine = self.distributed_type
        if self.zero_stage is not None:
            engine += f" ZeRO-{self.zero_stage}"
            if self.offload_optimizer not in (None, "none"):
                engine += f" (optimizer offload: {self.offload_optimizer})"
        per_machine = self.num_processes // max(self.num_machines, 1)
        node = ""
        if self.num_machines > 1 and self.names_node():
            node = f"; this is machine {self.machine_rank}, the main one at {self.main_process_ip}"
        return (
            f"{self.num_processes} training process(es) on {self.num_machines} machine(s) "
            f"({per_machine} per machine), {engine}{node}"
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
        mixed_precision=config.get("mixed_precision"),
        machine_rank=_int_from(args.machine_rank, NODE_RANK_ENV),
        main_process_ip=args.main_process_ip or os.environ.get("MASTER_ADDR") or None,
        main_process_port=_int_from(args.main_process_port, ("MASTER_PORT",), config.get("main_process_port")),
    )


def _int_from(given: int | None, names: tuple[str, ...], fallback: int | None = None) -> int | None:
    """``given`` if set, else the first of the environment variables ``names`` that is set, else ``fallback``."""
    if given is not None:
        return given
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise ValueError(f"${name} is {value!r}, not a whole number: fix it or unset it")
            return int(value)
    return fallback


def accelerate_command(layout: Layout, recipe_args: list[str], extra: list[str] = ()) -> list[str]:
    """The ``accelerate launch`` command that runs this recipe with its layout (``extra``: more launch flags)."""
    cmd = ["accelerate", "launch"]
    if layout.accelerate_config is not None:
        path = Path(layout.accelerate_config).resolve()
        shown = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
        cmd += ["--config_file", shown]
    elif layout.num_processes > 1:
        # without a config, accelerate starts several processes only where it sees several GPUs; --multi_gpu is its
        # torchrun launcher (on a CPU machine hf_grpo's config then trains over gloo, as accelerate_configs/cpu.yaml)
        cmd.append("--multi_gpu")
    cmd += ["--num_processes", str(layout.num_processes), "--num_machines", str(layout.num_machines), *extra]
    return cmd + ["-m", "hf_grpo.train", *recipe_args]


def unnamed_node_message(machines: int) -> str:
    return (
        f"this recipe runs on {machines} machines: start the same command on each, naming the node and the main "
        f"one: --machine_rank R (0 on the main node, up to {machines - 1}) --main_process_ip ADDRESS (the main "
        "node's, as the others reach it), or set $NODE_RANK and $MASTER_ADDR; --dry-run prints each node's command"
    )


HOSTNAME_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")  # RFC 1123


def main_address_problem(address: str, source: str, resolve: bool) -> str | None:
    """Why ``address`` cannot be the main node's (``source``: where it was given), or None: neither an IP address nor
    a hostname, or (``resolve``) a name this machine cannot resolve. torch's rendezvous would retry it in silence for
    minutes (its timeout is 600 s) before failing."""
    try:
        ipaddress.ip_address(address.strip("[]"))
        return None
    except ValueError:
        pass
    labels = address.removesuffix(".").split(".")
    if len(address) > 253 or labels[-1].isdigit() or not all(HOSTNAME_LABEL.fullmatch(label) for label in labels):
        return (
            f"{source} {address!r} is neither an IP address nor a hostname: give the main node's address as the "
            "other machines reach it (for example 10.0.0.1, or its hostname)"
        )
    if resolve:
        try:
            socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            return (
                f"{source} {address!r} does not resolve on this machine ({exc.strerror or exc}): give the main "
                "node's IP address, or a name this machine resolves (DNS or /etc/hosts)"
            )
    return None


def main_port_problem(port: int) -> str | None:
    """Why the main node (machine_rank 0: this one) cannot listen on ``port`` here, or None. Bound as torch's store
    binds it: every interface, SO_REUSEADDR (a port left in TIME_WAIT by an earlier run is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return port_taken_message(port)
            return f"main_process_port {port} cannot be used on this machine ({exc.strerror}): choose another"
    return None


def loopback_host_problem(layout: Layout, gloo: bool) -> str | None:
    """Why the other machines could not reach this one's training processes over gloo, or None.

    gloo gives its peers the address this machine's hostname resolves to, and many installs map the hostname to a
    loopback address (Debian's ``127.0.1.1``): the first collective then fails on one node and hangs on the other.
    Not a problem when ``$GLOO_SOCKET_IFNAME`` names the interface, or when every machine is this host.
    """
    if layout.num_machines < 2 or not gloo or os.environ.get("GLOO_SOCKET_IFNAME") or not layout.main_process_ip:
        return None
    if _resolves_to_loopback(layout.main_process_ip):
        return None  # the main node is this host: all "machines" are here (a miniature's)
    host = socket.gethostname()
    if not _resolves_to_loopback(host):
        return None
    return (
        f"this machine's hostname {host!r} resolves to a loopback address, which the other machines cannot reach "
        "(gloo announces the hostname's address): set GLOO_SOCKET_IFNAME to the network interface the machines share "
        "on every node (for example GLOO_SOCKET_IFNAME=eth0; `ip -br addr` lists them), or map the hostname to that "
        "interface's address in /etc/hosts"
    )


def _resolves_to_loopback(name: str) -> bool:
    """Whether ``name`` (a hostname or an address) resolves to a loopback address; False when it does not resolve."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(name)).is_loopback
    except (OSError, ValueError):
        return False
