"""Train a policy with GRPO from one YAML recipe.

    accelerate launch -m hf_grpo.train recipes/qwen7b.yaml          # a recipe (positional, or --config PATH)
    accelerate launch -m hf_grpo.train                              # the embedded tiny default (recipes/tiny.yaml)
    python -m hf_grpo.train recipes/qwen7b.yaml --dry-run           # check it and print layout and batch arithmetic
    python -m hf_grpo.train recipes/qwen7b.yaml --miniature         # run it on this machine in miniature (CPU)
    python -m hf_grpo.train recipes/tiny.yaml --learning_rate 1e-3  # override any key on the command line
    hf-grpo train recipes/tiny.yaml                                 # the same, from the hf-grpo console command

A run loads the policy (or builds and warm-starts the embedded tiny model), the datasets and the reward functions,
measures held-out accuracy, trains with ``hf_grpo.GRPOTrainer``, saves the model (the adapter, as safetensors, with
LoRA), measures held-out accuracy again and writes ``eval_results.json``, ``training_history.json`` and
``training_curves.png`` to ``output_dir``. A recipe error exits with code 2 and a one-line message. The run itself is
``hf_grpo.run.pipeline``; this module is its command line and ``train()``, the same from Python.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import json
import logging
import os
import re
import sys
import tempfile
import textwrap
from pathlib import Path

import torch.distributed
from safetensors import SafetensorError

from .base import crash_log
from .base.run_files import RunFileError
from .base.stopping import StopSignal, stops_held
from .generation.server import ServerStartError
from .generation.vllm_client import VLLMConnectionError, VLLMServerError
from .launch.launcher import (
    LAUNCHED_ENV,
    SERVER_STARTED_ENV,
    ProgramNotFound,
    apply_thread_policy,
    inside_launch,
    needs_launcher,
    node_commands,
    plan_commands,
    run_launcher,
    stop_like_ctrl_c,
    stopped_summary,
)
from .recipe import NESTED, RecipeError, apply_env, field_index, load_recipe, nested_index, render_dry_run
from .rewards.wrapper import RewardFailedError
from .run.pipeline import claim_output_dir, resume_target, run
from .training.dynamic_sampling import SamplingExhausted


logger = logging.getLogger("hf_grpo")

PROG = "python -m hf_grpo.train"  # the name in --help; `hf-grpo train` passes its own
KEYS_HELP = """
Every key below is a recipe key: set it in the recipe file, or override it here as --key value (a YAML scalar or
[a, b]; dashes and underscores alike; --flag alone sets a boolean). Keys of the generation mapping are written
--generation.key value.
"""
FLAG_HELP = """
flags:
  --dry-run     check the recipe, print the resolved values, layout, batch arithmetic and commands; run nothing
  --miniature   run the recipe here in miniature: same code path, tiny local model and data, 2 steps, 2 processes
                (with --dry-run: print exactly what a miniature swaps)
"""


def train(recipe: str | None = None, **overrides) -> dict:
    """Run a recipe from Python (a notebook, a script): ``train("recipes/tiny.yaml", max_steps=30)``.

    Keyword arguments override recipe keys exactly as ``--key value`` does on the command line (``generation`` takes
    a dict). Returns the before/after held-out evaluation. Raises ``RecipeError`` for a bad recipe.
    """
    argv = [recipe] if recipe else []
    for key, value in overrides.items():
        if key in NESTED and isinstance(value, dict):
            argv += [f"--{key}.{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items()]
        else:
            argv.append(f"--{key}={json.dumps(value) if not isinstance(value, str) else value}")
    apply_thread_policy()
    loaded, _ = load_recipe(argv, for_run=True)
    apply_env(loaded)
    return run(loaded)


def type_name(hint) -> str:
    """A key's type as help shows it: ``float``, ``str | None``, ``SchedulerType | str``."""
    text = hint.__name__ if isinstance(hint, type) else str(hint).replace("NoneType", "None")
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", text)  # without module paths (typing., transformers.trainer_utils.)


def default_text(f: dataclasses.Field) -> str:
    """A key's default as YAML would write it (``null``, ``true``, ``"linear"``), or ``required``."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    elif f.default is dataclasses.MISSING:
        return "required"
    else:
        value = f.default
    return json.dumps(getattr(value, "value", value), default=str)  # an enum by its value


def render_help(prog: str) -> str:
    """``--help``: every recipe key by section, with its type, default and help, from the recipe's field index."""
    keys = [(section, name, f, hint) for name, (section, f, hint) in field_index().items()]
    for section in NESTED:
        keys += [(section, f"{section}.{name}", f, hint) for name, (f, hint) in nested_index(section).items()]
    lines = [f"usage: {prog} [RECIPE.yaml | --config RECIPE.yaml] [--KEY VALUE ...] [--dry-run] [--miniature]"]
    lines += ["", __doc__.splitlines()[0], KEYS_HELP.rstrip()]
    for section, fields in itertools.groupby(keys, key=lambda key: key[0]):
        lines.append(f"\n{section} keys:")
        for _, name, f, hint in fields:
            choices = f.metadata.get("choices")
            kind = "{" + ",".join(map(str, choices)) + "}" if choices else type_name(hint)
            lines.append(f"  --{name} {kind} (default: {default_text(f)})")
            text = " ".join(f.metadata.get("help", "").replace("%%", "%").split())  # argparse's %% escapes
            lines += textwrap.wrap(text, width=116, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n" + FLAG_HELP


_said: set[str] = set()  # the error lines this call of main() wrote


def fail(message: str, status: int = 2) -> int:
    """A one-line error on stderr (no traceback); ``status`` is the exit status. One write with its newline: the
    processes of a launch share stderr, and unbuffered (PYTHONUNBUFFERED) print's two writes could join their lines."""
    line = f"hf_grpo: error: {message}\n"
    if line in _said:  # said again only where a stop signal cut its first saying short (ended_by)
        return status
    with stops_held():  # written and noted as written, or neither
        sys.stderr.write(line)
        sys.stderr.flush()
        _said.add(line)
    crash_log.mark_error()  # the launcher's closing line then points at this one
    return status


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _said.clear()
    dry_run = any(a in ("--dry-run", "--dry_run") for a in argv)
    if any(a in ("-h", "--help") for a in argv):
        print(render_help(prog))  # noqa: T201
        return 0
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    apply_thread_policy()  # before anything computes (a miniature builds its model while loading the recipe)
    try:
        recipe, _ = load_recipe(argv, for_run=not dry_run)
    except RecipeError as exc:
        return fail(exc)
    passthrough = [a for a in argv if a not in ("--dry-run", "--dry_run")]
    if dry_run:
        commands = [str(c) for c in plan_commands(recipe, passthrough, every_node=True)]
        print(render_dry_run(recipe, commands, node_commands(recipe, passthrough)))  # noqa: T201
        return 0
    apply_env(recipe)
    if needs_launcher(recipe):
        try:
            if recipe.layout.num_machines == 1:  # a bad or changed checkpoint, the output_dir lock: before the launch
                resume_target(recipe, recipe.layout.num_processes)
            claim_output_dir(recipe)  # before the launch writes its server's log there
            # with several machines the training processes check, where every rank agrees or all stop at once
            # (pipeline.agree_on_resume): one node refusing here would leave the others waiting for it in silence
            return run_launcher(recipe, passthrough)
        except (ProgramNotFound, RecipeError) as exc:
            return fail(exc)
        except ServerStartError as exc:  # the server did not come up, or its port was taken
            return fail(exc, status=1)
    if recipe.generation.starts_server() and inside_launch():
        return fail(
            "this recipe starts a vLLM server (generation.backend: vllm_server), which needs the launcher: run "
            "`python -m hf_grpo.train RECIPE` instead of `accelerate launch`, or start the server yourself and set "
            "generation.base_url"
        )
    restore_handlers = stop_like_ctrl_c()  # SIGTERM, or `accelerate launch` dying: the one line below, nothing left
    try:
        run(recipe)
    except BaseException as exc:  # noqa: BLE001  (ended_by raises again what it does not explain)
        try:
            return ended_by(recipe, passthrough, exc)
        except StopSignal:  # the launch stopping this process (another one failed) while this one says why it ended
            return ended_by(recipe, passthrough, exc)  # said to the end: only the first stop signal raises
    finally:  # the outcome is decided: SIGTERM while exiting (the launch stopping the others) just ends it
        with stops_held():  # one landing while the handlers change would raise here, with a traceback: it waits
            restore_handlers()
        end_process_group()
    return 0


def ended_by(recipe, argv: list[str], exc: BaseException) -> int:
    """The exit status of a run that raised ``exc``, after its one line (or none, where another process says it);
    an error none of these explains is raised again, with its traceback."""
    if isinstance(exc, (RecipeError, RunFileError)):  # found before loading (the checkpoint, a damaged run file)
        return fail(exc)
    if isinstance(exc, RewardFailedError):  # a reward failing on every completion (reward_max_failed_calls)
        print(file=sys.stderr)  # noqa: T201  (the error on a line of its own, after tqdm's)
        return fail(exc, status=1)
    if isinstance(exc, (VLLMConnectionError, VLLMServerError)):  # the server died, hung or broke mid-run
        return server_failed(recipe, argv, exc)
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or the launcher stopping its processes
        return interrupted(recipe, argv, exc)
    if isinstance(exc, SamplingExhausted):  # dynamic_sampling_exhausted: error (before RuntimeError: it is one)
        return sampling_exhausted(recipe, argv, exc)
    if isinstance(exc, (OSError, RuntimeError, SafetensorError)):  # a full disk reaches us as any of the three
        full = out_of_space(exc, recipe.training.output_dir)
        if full is not None:
            return disk_full(recipe, argv, full)
        if isinstance(exc, RuntimeError) and peer_lost(exc):
            return peer_gone(recipe, argv, exc)
    raise exc


def end_process_group() -> None:
    """Shut this process's group down (a local call) before the interpreter exits: a 2-process gloo group left to
    the interpreter's exit aborted now and then under load ("terminate called without an active exception", SIGABRT),
    so the launcher reported a finished run, or one refused with exit 2, as a crash."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


PEER_GONE = re.compile(r"closed by peer|reset by peer|remote worker|Broken pipe|Timed out waiting", re.IGNORECASE)


def peer_lost(exc: RuntimeError) -> bool:
    """Whether ``exc`` is a collective failing because another training process of this run ended (gloo's
    "Connection closed by peer", NCCL's DistBackendError) or did not answer within ``ddp_timeout`` (gloo's "Timed out
    waiting"): that process's error, if any, is the one to show, not this echo."""
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return several and (isinstance(exc, torch.distributed.DistError) or bool(PEER_GONE.search(str(exc))))


def peer_gone(recipe, argv: list[str], exc: RuntimeError) -> int:
    """Another training process ended mid-collective. On one machine its own error (if it could print one) says
    why, and this echo only goes to the crash log. With several machines that error is on another machine, so each
    node says here, once, what happened and where to look."""
    traceback_log = crash_log.write(recipe.training.output_dir, exc)
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if not local or world <= local or os.environ.get("LOCAL_RANK", "0") != "0":
        return 1
    detail = re.sub(r"^\[[^\]]*\]\s*", "", " ".join(str(exc).split())).split(". ")[0][:200]  # gloo: "[file:line] ..."
    print(file=sys.stderr)  # noqa: T201  (the error on a line of its own, after tqdm's)
    return fail(
        f"lost contact with another training process of this run ({detail}): it ended, hung "
        f"or its machine became unreachable; its own error, if it printed one, is on its machine; this one's "
        f"traceback: {traceback_log}; resume with: {crash_log.resume_command(argv)}",
        status=1,
    )


def first_rank() -> bool:
    """Whether this process prints a run's one closing line (rank 0, or a run of one process)."""
    return os.environ.get("RANK", "0") == "0"


def server_failed(recipe, argv: list[str], exc: VLLMConnectionError | VLLMServerError) -> int:
    """One line for a server that stopped answering: which, its log, the traceback's file, the resume command."""
    traceback_log = crash_log.write(recipe.training.output_dir, exc)
    if not first_rank():
        return 1
    server_log = Path(recipe.training.output_dir) / "vllm_server.log"
    where = server_log if os.environ.get(SERVER_STARTED_ENV) else "wherever you started the server"
    print(file=sys.stderr)  # noqa: T201  (the error on a line of its own, after tqdm's)
    return fail(
        f"the vLLM server at {recipe.generation.url} stopped answering ({' '.join(str(exc).split())}); its log: "
        f"{where}; the traceback: {traceback_log}; resume with: {crash_log.resume_command(argv)}",
        status=1,
    )


SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE = re.compile(r"os error (28|122)\b|No space left|Disk quota exceeded")  # safetensors' Rust io::Error text
# torch.save's stream writer reports a failed write without its errno ("file write failed", "unexpected pos")
TORCH_WRITE_FAILED = re.compile(r"PytorchStreamWriter|inline_container|file write failed|iostream error")
PROBE_BYTES = 1 << 20


def out_of_space(exc: BaseException, folder: str) -> OSError | None:
    """The no-space error behind ``exc``, or None. ``OSError`` carries its errno; safetensors' ``SafetensorError``
    carries the OS error's text; torch.save's ``RuntimeError`` carries neither, so a failed torch write counts when
    writing ``PROBE_BYTES`` into ``folder`` fails with no space too (a checkpoint's optimizer, scheduler or RNG file)."""
    if isinstance(exc, OSError):
        return exc if exc.errno in SPACE_ERRNOS else None
    text = f"{exc} {exc.__context__ or ''}"
    if NO_SPACE.search(text):
        code = errno.EDQUOT if re.search(r"os error 122\b|quota", text) else errno.ENOSPC
        return OSError(code, os.strerror(code), f"a file in {folder}")
    if not TORCH_WRITE_FAILED.search(text):
        return None
    try:
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as probe_error:
        if probe_error.errno in SPACE_ERRNOS:
            return OSError(probe_error.errno, probe_error.strerror, f"a checkpoint file in {folder}")
    return None


def disk_full(recipe, argv: list[str], exc: OSError) -> int:
    """No space left (or over quota) while writing: the file, the folder to free, the resume command."""
    crash_log.write(recipe.training.output_dir, exc)  # may fail too: it says nothing then
    if not first_rank():
        return 1
    print(file=sys.stderr)  # noqa: T201  (the error on a line of its own, after tqdm's)
    return fail(
        f"{exc.strerror} writing {exc.filename or 'a file'}: free space where output_dir "
        f"({recipe.training.output_dir}) lives (`df -h {recipe.training.output_dir}`); the last complete checkpoint "
        f"is kept; resume with: {crash_log.resume_command(argv)}",
        status=1,
    )


def sampling_exhausted(recipe, argv: list[str], exc: SamplingExhausted) -> int:
    """Dynamic sampling ran out of rounds (``dynamic_sampling_exhausted: error``, raised on every process): what ran
    out and the fix, the traceback's file, the resume command (from the last complete checkpoint)."""
    traceback_log = crash_log.write(recipe.training.output_dir, exc)
    if not first_rank():
        return 1
    print(file=sys.stderr)  # noqa: T201  (the error on a line of its own, after tqdm's)
    return fail(f"{exc}; the traceback: {traceback_log}; then resume with: {crash_log.resume_command(argv)}", status=1)


def interrupted(recipe, argv: list[str], exc: KeyboardInterrupt) -> int:
    """Stopped by SIGINT: the traceback to a crash log; one summary line unless a launcher prints it."""
    crash_log.write(recipe.training.output_dir, exc)
    if first_rank() and LAUNCHED_ENV not in os.environ:
        crash_log.say(f"\n{stopped_summary(recipe, argv)}")  # a terminal closed by SIGHUP takes it quietly
    return 130


if __name__ == "__main__":
    sys.exit(main())
