"""``vllm serve``'s command line for the stand-in server: parse it as vLLM does, then serve until SIGTERM.

    python -m hf_grpo.vllm_standin MODEL_DIR --host 127.0.0.1 --port 8000 \\
        --logprobs-mode processed_logprobs --enable-lora --max-lora-rank 16     # what a miniature's launcher runs
    VLLM_SERVER_DEV_MODE=1 python -m hf_grpo.vllm_standin MODEL_DIR \\
        --weight-transfer-config '{"backend": "nccl"}' --max-logprobs -1        # TRL's full-weight sync

An unknown flag exits with status 2; flags that mean nothing on one CPU are accepted and logged. Flags,
environment variables and the stand-in's own additions: docs/vllm_protocol.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import signal
import sys
import threading
from pathlib import Path

import torch

from ..generation.settings import LORA_RANKS  # vLLM's MaxLoRARanks
from .engine import UNSUPPORTED_LOGPROBS_MODES, env_flag
from .server import ServerApp, StandInHTTPServer, check_host


logger = logging.getLogger("hf_grpo.vllm_standin.server")

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
NO_EFFECT = (  # flag: why it means nothing on one CPU
    ("gpu_memory_utilization", "no GPU"),
    ("tensor_parallel_size", "one CPU worker"),
    ("data_parallel_size", "one CPU worker"),
    ("dtype", "the model runs in float32"),
    ("max_loras", "not enforced"),
)


def _human_int_or_auto(value: str) -> int | None:
    """vLLM's ``--max-model-len`` syntax: an integer, ``1k`` (10^3), ``1K`` (2^10), ..., or ``-1``/``auto``."""
    value = value.strip()
    if value.lower() in ("-1", "auto"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(suffix) or 2 ** (10 * ("KMGT".index(suffix) + 1))
        return int(float(number) * scale)
    return int(value)


def build_parser(prog: str = "python -m hf_grpo.vllm_standin") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [model_tag] [options]",
        description="hf_grpo's CPU stand-in for `vllm serve` (loopback only). Takes vllm serve's flags.",
    )
    add = parser.add_argument
    add("model_tag", nargs="?", help="model directory (a transformers causal LM and tokenizer)")
    add("--model", default=None, help="same as model_tag (model_tag wins)")
    add("--host", default="127.0.0.1", help="loopback only: 127.0.0.1, localhost or ::1")
    add("--port", type=int, default=8000, help="0 picks a free port (not vLLM's)")
    add("--served-model-name", nargs="+", default=None)
    add("--seed", type=int, default=None, help="sampling seed of unseeded requests (default 0)")
    add("--logprobs-mode", choices=LOGPROBS_MODES, default="raw_logprobs")
    add("--max-logprobs", type=int, default=20, help="-1: no limit")
    add("--max-model-len", type=_human_int_or_auto, default=None)
    add("--enable-lora", action=argparse.BooleanOptionalAction, default=False)
    add("--max-lora-rank", type=int, choices=LORA_RANKS, default=16)
    add("--max-loras", type=int, default=None, help="accepted, not enforced")
    add("--dtype", choices=DTYPES, default=None, help="no effect: float32 on CPU")
    add("--gpu-memory-utilization", type=float, default=None, help="no effect on CPU")
    add("--tensor-parallel-size", "-tp", type=int, default=None, help="no effect: one CPU worker")
    add("--data-parallel-size", "-dp", type=int, default=None, help="no effect: one CPU worker")
    add("--weight-transfer-config", type=json.loads, default=None, help='e.g. {"backend": "nccl"}')
    add("--ready-file", default=None, help="write the URL here once serving (not vLLM's)")
    add(
        "--numerics",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: bf16 weights, so log-probs differ from an fp32 trainer's as a bf16 vLLM's do (not vLLM's)",
    )
    return parser


def _dashes(argv: list[str]) -> list[str]:
    """vLLM's parser accepts ``--flag_name`` for ``--flag-name`` (and ``--flag_name=value``)."""
    return [re.sub(r"^--[^=]*", lambda flag: flag[0].replace("_", "-"), arg) for arg in argv]


def _check_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2) what vLLM refuses, and what the stand-in cannot do."""
    try:
        args.bind = check_host(args.host)
    except ValueError as exc:
        parser.error(str(exc))
    if args.logprobs_mode in UNSUPPORTED_LOGPROBS_MODES:
        parser.error(f"--logprobs-mode {args.logprobs_mode} is not implemented by hf_grpo's CPU stand-in")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        parser.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    for flag in ("tensor_parallel_size", "data_parallel_size", "max_loras"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    config = args.weight_transfer_config
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"backend"}:
            parser.error(f"--weight-transfer-config: expected a JSON object with only 'backend', got {config!r}")
        config.setdefault("backend", "nccl")
        if config["backend"] != "nccl":
            parser.error(
                f"--weight-transfer-config backend {config['backend']!r}: hf_grpo's CPU stand-in implements 'nccl' "
                "(as TCP on 127.0.0.1) only"
            )


def parse_args(argv: list[str] | None = None, prog: str = "python -m hf_grpo.vllm_standin") -> argparse.Namespace:
    """Parse ``vllm serve``'s flags; exits with status 2 (as vLLM does) on an unknown flag or a bad value."""
    parser = build_parser(prog)
    args = parser.parse_args(_dashes(list(sys.argv[1:] if argv is None else argv)))
    args.model = args.model_tag or args.model
    if not args.model:
        parser.error("the model is required (positional model_tag or --model)")
    _check_values(parser, args)
    try:
        args.dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        parser.error(
            f"VLLM_SERVER_DEV_MODE={os.environ['VLLM_SERVER_DEV_MODE']!r}: vLLM reads it as an integer (0 or 1)"
        )
    args.allow_runtime_lora_updating = env_flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    return args


def no_effect_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that mean nothing on one CPU, spelled as given, with why."""
    return [
        f"--{flag.replace('_', '-')} {getattr(args, flag)} ({why})"
        for flag, why in NO_EFFECT
        if getattr(args, flag) is not None
    ]


def main(argv: list[str] | None = None, app_class: type[ServerApp] = ServerApp, prog: str | None = None) -> None:
    """Serve as ``vllm serve`` would until SIGTERM; ``app_class``: a ``ServerApp`` with more routes (tests)."""
    args = parse_args(argv, prog or "python -m hf_grpo.vllm_standin")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # hf_grpo.launch.launcher.torch_threads' rule (OMP_NUM_THREADS, else 1), which this lower layer cannot import
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    torch.set_num_threads(max(int(threads), 1) if threads.isdigit() else 1)
    notes = no_effect_flags(args)
    if notes:
        logger.info("hf_grpo CPU stand-in for vllm serve: flags with no effect on CPU: %s", "; ".join(notes))
    if args.dev_mode:
        logger.warning("Development endpoints are enabled (VLLM_SERVER_DEV_MODE): weight transfer, server_info.")
    try:
        app = app_class(
            args.model,
            served_model_name=args.served_model_name,
            enable_lora=args.enable_lora,
            max_lora_rank=args.max_lora_rank,
            allow_runtime_lora_updating=args.allow_runtime_lora_updating,
            logprobs_mode=args.logprobs_mode,
            max_logprobs=args.max_logprobs,
            max_completion_prompts=int(os.environ.get("VLLM_MAX_COMPLETION_PROMPTS", "1024")),
            max_model_len=args.max_model_len,
            seed=0 if args.seed is None else args.seed,
            dev_mode=args.dev_mode,
            weight_transfer_config=args.weight_transfer_config,
            numerics=args.numerics,
        )
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"vLLM stand-in: cannot load {args.model}: {exc}\n")
        raise SystemExit(1) from exc
    server = StandInHTTPServer(app, args.port, args.bind)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    if args.ready_file:
        tmp = Path(args.ready_file + f".{secrets.token_hex(4)}.tmp")
        tmp.write_text(server.url)
        tmp.replace(args.ready_file)
    sys.stderr.write(f"vLLM stand-in: {app.served_model_name} at {server.url}\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()
