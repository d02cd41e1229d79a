"""A CPU stand-in for ``vllm serve``: real HTTP on loopback, vLLM 0.30's routes and JSON, a transformers model behind.

    python -m hf_grpo.miniature.vllm_server MODEL_DIR --host 127.0.0.1 --port 8000 \\
        --logprobs-mode processed_logprobs --enable-lora --max-lora-rank 16     # what a miniature's launcher runs
    VLLM_SERVER_DEV_MODE=1 python -m hf_grpo.miniature.vllm_server MODEL_DIR \\
        --weight-transfer-config '{"backend": "nccl"}' --max-logprobs -1        # TRL's full-weight sync

It takes ``vllm serve``'s command line as ``hf_grpo.generation.layout.server_command`` writes it (the model as the
positional argument or ``--model``; ``--host``, ``--port``, ``--served-model-name``, ``--seed``, ``--logprobs-mode``,
``--max-logprobs``, ``--max-model-len``, ``--enable-lora``, ``--max-lora-rank``, ``--max-loras``, ``--dtype``,
``--gpu-memory-utilization``, ``--tensor-parallel-size``, ``--data-parallel-size``, ``--weight-transfer-config``;
``--flag=value`` and ``--flag_name`` spellings too) and fails at start on any other flag, as vLLM's parser does.
Flags that mean nothing on one CPU (GPU memory, tensor and data parallelism, ``--dtype``: the model runs in float32,
``--max-loras``: not enforced) are accepted and listed once in the log as having no effect. It binds loopback
addresses only (127.0.0.1, localhost, ::1) and refuses any other ``--host``. Like vLLM it reads
``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (``1``/``true``, any case) and ``VLLM_SERVER_DEV_MODE`` (an integer; non-zero
enables the development routes), ``VLLM_MAX_COMPLETION_PROMPTS`` and ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``. Two
conveniences that are not vLLM's: ``--port 0`` picks a free port, and ``--ready-file F`` writes the URL to F once the
server answers.

Routes (request and response fields spelled as vLLM spells them; the client-side protocol notes are in
``hf_grpo.generation.vllm_client``; sampling is ``hf_grpo.miniature.engine``):

- ``GET /health`` (200, empty body); ``GET /v1/models`` (the served name(s), then one card per adapter, ``parent`` =
  base).
- ``POST /v1/completions``: ``prompt`` as token ids (``list[int]`` or ``list[list[int]]``) or text; ``model`` (a
  served name, an adapter, or omitted); ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``,
  ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``min_tokens``, ``seed`` (sample i draws with
  seed+i), ``stop_token_ids``, ``ignore_eos``, ``logprobs`` (k >= 0 or -1, at most ``--max-logprobs``),
  ``return_token_ids``, ``return_tokens_as_token_ids``, ``skip_special_tokens``. Bad values are a 400 with vLLM's
  message; a prompt plus ``max_tokens`` over ``--max-model-len`` is a 400.
- ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, only with runtime LoRA updating allowed (else 404
  ``{"detail": "Not Found"}``): reads ``adapter_config.json`` and ``adapter_model.safetensors`` from ``lora_path``
  and merges the adapter into a copy of the base with PEFT; ``load_inplace`` replaces a loaded name; vLLM's statuses
  (already loaded 400, no adapter 404, rank above ``--max-lora-rank``, DoRA, ``modules_to_save`` or a LoRA bias
  (refused by vLLM's ``PEFTHelper``), a module that is neither a linear layer nor an embedding (vLLM's "expected
  target modules in ..."), or LoRA disabled 500, unknown on unload 404).
- With ``VLLM_SERVER_DEV_MODE`` set, the development routes TRL 1.16's ``VLLMClient`` calls (paths, bodies and
  answers of vLLM 0.30's ``serve/dev`` routers): ``GET /server_info?config_format=json`` (``{"vllm_config": {...,
  "model_config": {..., "logprobs_mode"}, "weight_transfer_config": {"backend": "nccl"} | null}, "vllm_env",
  "system_env"}``), ``GET /get_world_size`` (``{"world_size": 1}``: one CPU worker), ``POST /reset_prefix_cache``
  (``{"success": true}``: there is no prefix cache), ``POST /init_weight_transfer_engine`` ``{"init_info":
  {master_address, master_port, rank_offset, world_size, packed, ...}}``, ``POST /start_weight_update``, ``POST
  /update_weights`` ``{"update_info": {names, dtype_names, shapes}}``, ``POST /finish_weight_update``; each answers
  ``{"message": ...}``. The weights travel over ``hf_grpo.miniature.transport`` (TCP on 127.0.0.1) where vLLM uses
  NCCL; the trainer side of it is the stand-in ``vllm`` package (``hf_grpo.miniature.vllm_standin``). Every announced
  name and shape is checked before any byte is loaded: an unknown name (400) or a wrong shape (500) loads nothing,
  the announced bytes are still read so the trainer's broadcast completes, and the group stays usable. Bytes that do
  not match the announcement (500) leave the group unusable until the next ``/init_weight_transfer_engine``, where
  NCCL would hang. Loaded adapters are re-merged onto the new base weights at ``/finish_weight_update``.

Not implemented (400 saying so): ``stream``, ``echo``, ``prompt_logprobs``, beam search, ``stop`` strings,
``logprob_token_ids``, structured outputs, ``logit_bias``, ``allowed_token_ids``, ``bad_words``. Not served (404):
chat completions, tokenize, the other development routes (sleep, pause, collective RPC, ...). Not mimicked: batching across requests, prefix caching, API keys, vLLM's numerics (``--numerics bfloat16``, not a
vLLM flag, serves bf16 weights, so log-probs differ from an fp32 trainer's as a bf16 engine's do).

Test-only controls under ``/fixture/`` (never counted, delayed or failed themselves): ``GET /fixture/adapters``
(``{name: {lora_path, sha256, lora_int_id, load_count}}``), ``GET /fixture/stats`` (request counts),
``GET /fixture/weights`` (``{"sha256": {name: engine.tensor_digest}}`` of the served base weights),
``GET /fixture/weight_updates`` (one record per ``/update_weights``: tensor count and the weights' digest after it),
``POST /fixture/fail`` ``{"count", "status", "path"}``, ``POST /fixture/delay`` ``{"seconds", "count", "path"}``,
``POST /fixture/reset`` ``{"adapters": bool}``.

In a test: ``with start_in_thread(model_dir, enable_lora=True) as server: server.url``, or as a process that can be
SIGKILLed: ``server = start_subprocess(model_dir); ...; server.kill()``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import torch

from ..generation.layout import LORA_RANKS  # vLLM's MaxLoRARanks
from . import transport
from .engine import UNSUPPORTED_LOGPROBS_MODES, SamplingEngine, SamplingSpec, combined_digest


logger = logging.getLogger("hf_grpo.miniature.vllm_server")  # the same name when run with python -m

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory that holds hf_grpo/ (a checkout or site-packages)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
GREEDY_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature is greedy sampling
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
NOT_IMPLEMENTED_FIELDS = (
    "stream",
    "echo",
    "use_beam_search",
    "prompt_logprobs",
    "stop",
    "logprob_token_ids",
    "structured_outputs",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
)
INIT_INFO_FIELDS = {
    "master_address",
    "master_port",
    "rank_offset",
    "world_size",
    "nccl_unique_id_b64",
    "packed",
    "packed_buffer_size_bytes",
    "packed_num_buffers",
}
UPDATE_INFO_FIELDS = ("names", "dtype_names", "shapes")


def unsupported_lora_features(config) -> list[str]:
    """What vLLM's adapter loader refuses in an adapter config (``PEFTHelper._validate_features`` and its bias check),
    in vLLM's words; empty when vLLM would load it."""
    problems = []
    if getattr(config, "modules_to_save", None):
        problems.append("vLLM only supports modules_to_save being None.")
    if getattr(config, "use_dora", False):
        problems.append("vLLM does not yet support DoRA.")
    if getattr(config, "bias", "none") != "none":
        problems.append("Adapter bias is not supported.")
    return problems


def unexpected_lora_modules(state: dict, expected: set[str]) -> list[str]:
    """The adapter's modules whose last name vLLM does not apply LoRA to (``LoRAModel.check_unexpected_modules``)."""
    modules = {re.sub(r"\.lora_(A|B|embedding_A|embedding_B)(\.[^.]+)?\.weight$", "", key) for key in state}
    return sorted(m.removeprefix("base_model.model.") for m in modules if m.rsplit(".", 1)[-1] not in expected)


class ApiError(Exception):
    """An error answered the way vLLM answers it: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def api_error_from(exc: Exception) -> ApiError:
    """vLLM's fallback mapping of a raw exception to a status (``serve/exception_handling/error_response.py``)."""
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return ApiError(400, str(exc), "BadRequestError")
    if isinstance(exc, NotImplementedError):
        return ApiError(501, str(exc), "NotImplementedError")
    return ApiError(500, str(exc) or type(exc).__name__, "InternalServerError")


class _NoRoute(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


@dataclass
class Adapter:
    model: torch.nn.Module
    path: str
    sha256: str
    lora_int_id: int
    config: Any  # peft.LoraConfig
    state: dict[str, torch.Tensor]
    load_count: int = 1


def _number(body: dict, key: str, default: Any, kind: type) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ApiError(400, f"1 validation error: `{key}` must be {kind.__name__}, got {value!r}", "Bad Request", key)
    return kind(value)


class ServerApp:
    """The model, the adapters, the weight transfer and the request logic, independent of HTTP."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        served_model_name: str | list[str] | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        allow_runtime_lora_updating: bool = False,
        logprobs_mode: str = "raw_logprobs",
        max_logprobs: int = 20,
        max_completion_prompts: int = 1024,
        max_model_len: int | None = None,
        seed: int = 0,
        dev_mode: bool = False,
        weight_transfer_config: dict | None = None,
        engine: SamplingEngine | None = None,
        numerics: str = "float32",
    ):
        # numerics="bfloat16": bf16 weights, so the served log-probs differ from the trainer's as a bf16 vLLM's do
        self.engine = engine or SamplingEngine(
            model_dir,
            logprobs_mode=logprobs_mode,
            max_model_len=max_model_len,
            seed=seed,
            dtype=getattr(torch, numerics),
        )
        self.model, self.tokenizer = self.engine.model, self.engine.tokenizer
        names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or [])
        self.served_model_names = names or [str(model_dir)]
        self.served_model_name = self.served_model_names[0]
        self.model_dir = str(model_dir)
        self.vocab_size, self.max_model_len = self.engine.vocab_size, self.engine.max_model_len
        self.enable_lora, self.max_lora_rank = enable_lora, max_lora_rank
        self.allow_runtime_lora_updating = allow_runtime_lora_updating
        self.logprobs_mode, self.max_logprobs = logprobs_mode, max_logprobs
        self.max_completion_prompts = max_completion_prompts
        self.seed, self.dev_mode = seed, dev_mode
        self.weight_transfer_config = weight_transfer_config
        self.adapters: dict[str, Adapter] = {}
        self._next_lora_id = 1
        self._model_lock = self.engine.lock  # one generation or weight load at a time: deterministic, gentle on CPUs
        self._lock = threading.Lock()
        # weight transfer (worker side)
        self._transfer_lock = threading.Lock()
        self._communicator: transport.CPUCommunicator | None = None
        self._init_info: dict | None = None
        self._transfer_failed: str | None = None
        self._update_active = False
        self.weight_updates: list[dict] = []
        self.reset()

    # ------------------------------------------------------------ fixture controls

    def reset(self, adapters: bool = False) -> None:
        with self._lock:
            self.counts: Counter[str] = Counter()
            self.fail_plan: dict | None = None
            self.delay_plan: dict | None = None
            if adapters:
                self.adapters.clear()

    def before_request(self, method: str, path: str) -> None:
        """Count the request, then apply an injected delay and an injected failure (in that order)."""
        if path.startswith("/fixture/"):
            return
        delay, fail = 0.0, None
        with self._lock:
            self.counts[f"{method} {path}"] += 1
            plan = self.delay_plan
            if plan and plan.get("path") in (None, path) and (plan["count"] is None or plan["count"] > 0):
                delay = plan["seconds"]
                if plan["count"] is not None:
                    plan["count"] -= 1
            plan = self.fail_plan
            if plan and plan.get("path") in (None, path) and plan["count"] > 0:
                plan["count"] -= 1
                fail = plan["status"]
        if delay:
            time.sleep(delay)
        if fail is not None:
            raise ApiError(fail, f"Injected failure {fail} (hf_grpo vLLM stand-in fixture)", "ServiceUnavailableError")

    def _fixture(self, path: str, body: Any) -> Any:
        body = body if isinstance(body, dict) else {}
        if path == "/fixture/weights":
            return {"sha256": self.engine.weight_digests()}
        with self._lock:
            if path == "/fixture/adapters":
                return {
                    "adapters": {
                        name: {
                            "lora_path": a.path,
                            "sha256": a.sha256,
                            "lora_int_id": a.lora_int_id,
                            "load_count": a.load_count,
                        }
                        for name, a in self.adapters.items()
                    }
                }
            if path == "/fixture/stats":
                return {"requests": dict(self.counts)}
            if path == "/fixture/weight_updates":
                return {"updates": list(self.weight_updates)}
            if path == "/fixture/fail":
                self.fail_plan = {
                    "count": int(body.get("count", 1)),
                    "status": int(body.get("status", 503)),
                    "path": body.get("path"),
                }
                return {"ok": True}
            if path == "/fixture/delay":
                count = body.get("count")
                self.delay_plan = {
                    "seconds": float(body.get("seconds", 1.0)),
                    "path": body.get("path"),
                    "count": None if count is None else int(count),
                }
                return {"ok": True}
        if path == "/fixture/reset":
            self.reset(adapters=bool(body.get("adapters", False)))
            return {"ok": True}
        raise _NoRoute(404, "Not Found")

    # ------------------------------------------------------------ routing

    def handle(self, method: str, path: str, body: Any, query: dict[str, str] | None = None) -> Any:
        """Returns None (empty 200), a str (text/plain 200) or a JSON-able object (200); raises on errors."""
        query = query or {}
        if path.startswith("/fixture/"):
            gets = ("/fixture/adapters", "/fixture/stats", "/fixture/weights", "/fixture/weight_updates")
            if method != ("GET" if path in gets else "POST"):
                raise _NoRoute(405, "Method Not Allowed")
            return self._fixture(path, body)
        routes = {
            "/health": ("GET", lambda: None),
            "/v1/models": ("GET", self.list_models),
            "/v1/completions": ("POST", lambda: self.completions(body)),
        }
        if self.allow_runtime_lora_updating:
            routes["/v1/load_lora_adapter"] = ("POST", lambda: self.load_lora_adapter(body))
            routes["/v1/unload_lora_adapter"] = ("POST", lambda: self.unload_lora_adapter(body))
        if self.dev_mode:
            routes.update(
                {
                    "/server_info": ("GET", lambda: self.server_info(query)),
                    "/get_world_size": ("GET", lambda: {"world_size": 1}),
                    "/reset_prefix_cache": ("POST", lambda: {"success": True}),
                    "/init_weight_transfer_engine": ("POST", lambda: self.init_weight_transfer_engine(body)),
                    "/start_weight_update": ("POST", self.start_weight_update),
                    "/update_weights": ("POST", lambda: self.update_weights(body)),
                    "/finish_weight_update": ("POST", self.finish_weight_update),
                }
            )
        if path not in routes:
            raise _NoRoute(404, "Not Found")
        expected, handler = routes[path]
        if method != expected:
            raise _NoRoute(405, "Method Not Allowed")
        return handler()

    def list_models(self) -> dict:
        now = int(time.time())
        base = [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": self.model_dir,
                "parent": None,
                "max_model_len": self.max_model_len,
            }
            for name in self.served_model_names
        ]
        with self._lock:
            cards = [
                {
                    "id": name,
                    "object": "model",
                    "created": now,
                    "owned_by": "vllm",
                    "root": a.path,
                    "parent": self.served_model_name,
                    "max_model_len": None,
                }
                for name, a in self.adapters.items()
            ]
        return {"object": "list", "data": [*base, *cards]}

    # ------------------------------------------------------------ development routes

    def server_info(self, query: dict[str, str]) -> dict:
        """vLLM's ``/server_info``: the resolved config (``config_format=json``: a tree, else its text)."""
        config_format = query.get("config_format", "text")
        if config_format not in ("text", "json"):
            raise ApiError(400, f"config_format must be 'text' or 'json', got {config_format!r}", "Bad Request")
        config = {
            "model_config": {
                "model": self.model_dir,
                "served_model_name": self.served_model_name,
                "max_model_len": self.max_model_len,
                "max_logprobs": self.max_logprobs,
                "logprobs_mode": self.logprobs_mode,
                "seed": self.seed,
                "dtype": "torch.float32",
            },
            "parallel_config": {
                "tensor_parallel_size": 1,
                "pipeline_parallel_size": 1,
                "data_parallel_size": 1,
                "world_size": 1,
            },
            "device_config": {"device": "cpu"},
            "lora_config": {"max_lora_rank": self.max_lora_rank} if self.enable_lora else None,
            "weight_transfer_config": self.weight_transfer_config,
            "additional_config": {"hf_grpo_cpu_standin": True},
        }
        env = {
            "VLLM_SERVER_DEV_MODE": self.dev_mode,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": self.allow_runtime_lora_updating,
        }
        system = {"torch_version": torch.__version__, "is_cuda_available": False, "platform": sys.platform}
        text = ", ".join(f"{k}={v}" for k, v in config.items())
        return {"vllm_config": config if config_format == "json" else text, "vllm_env": env, "system_env": system}

    def _check_transfer_configured(self) -> None:
        if self.weight_transfer_config is None:
            raise RuntimeError(
                "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer."
            )

    def init_weight_transfer_engine(self, body: Any) -> dict:
        init_info = body.get("init_info") if isinstance(body, dict) else None
        if init_info is None:
            raise ApiError(400, "Missing 'init_info' in request body", "Bad Request")
        self._check_transfer_configured()
        if not isinstance(init_info, dict) or set(init_info) - INIT_INFO_FIELDS:
            unknown = sorted(set(init_info) - INIT_INFO_FIELDS) if isinstance(init_info, dict) else init_info
            raise ValueError(f"Invalid init_info for NCCLWeightTransferEngine: unexpected fields {unknown}")
        missing = [k for k in ("rank_offset", "world_size") if k not in init_info]
        if missing:
            raise ValueError(f"Invalid init_info for NCCLWeightTransferEngine: missing {missing}")
        if init_info.get("nccl_unique_id_b64"):
            raise NotImplementedError(
                "hf_grpo's CPU weight transfer joins by master_address/master_port, not by an NCCL unique id"
            )
        if init_info.get("master_address") is None or init_info.get("master_port") is None:
            raise ValueError(
                "NCCLWeightTransferInitInfo: need nccl_unique_id_b64, or both master_address and master_port"
            )
        rank = 0 + int(init_info["rank_offset"])  # one CPU worker: worker rank 0
        with self._transfer_lock:
            if self._communicator is not None:
                self._communicator.group.close()
            self._communicator, self._transfer_failed = None, None
            self._communicator = transport.join_group(
                init_info["master_address"], int(init_info["master_port"]), rank, int(init_info["world_size"])
            )
            self._init_info = dict(init_info)
        logger.info(
            "joined the weight transfer group at %s:%s as rank %d of %d",
            init_info["master_address"],
            init_info["master_port"],
            rank,
            init_info["world_size"],
        )
        return {"message": "Weight transfer initialized"}

    def start_weight_update(self) -> dict:
        self._check_transfer_configured()
        with self._transfer_lock:
            if self._update_active:
                raise RuntimeError(
                    "start_weight_update called while a weight update is already active. Call finish_weight_update "
                    "first."
                )
            self._update_active = True
        return {"message": "Weight update started"}

    def _parse_update_info(self, update_info: Any) -> list[tuple[str, list[int], torch.dtype]]:
        if not isinstance(update_info, dict) or set(update_info) != set(UPDATE_INFO_FIELDS):
            fields = sorted(update_info) if isinstance(update_info, dict) else update_info
            raise ValueError(
                f"Invalid update_info for NCCLWeightTransferEngine: expected the fields {list(UPDATE_INFO_FIELDS)}, "
                f"got {fields}"
            )
        names, dtype_names, shapes = (update_info[k] for k in UPDATE_INFO_FIELDS)
        if len(dtype_names) != len(names) or len(shapes) != len(names):
            raise ValueError(
                f"`dtype_names` and `shapes` should be of the same size as `names`: got {len(dtype_names)}, "
                f"{len(shapes)} and {len(names)}"
            )
        metadata = []
        for name, dtype_name, shape in zip(names, dtype_names, shapes, strict=True):
            dtype = getattr(torch, str(dtype_name), None)
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"unknown dtype {dtype_name!r} for {name!r}")
            metadata.append((str(name), [int(d) for d in shape], dtype))
        return metadata

    def update_weights(self, body: Any) -> dict:
        update_info = body.get("update_info") if isinstance(body, dict) else None
        if update_info is None:
            raise ApiError(400, "Missing 'update_info' in request body", "Bad Request")
        self._check_transfer_configured()
        with self._transfer_lock:
            try:
                return self._update_weights(update_info)
            except BaseException:
                self._update_active = False  # as vLLM's worker does when an update fails
                raise

    def _update_weights(self, update_info: Any) -> dict:
        if not self._update_active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        communicator = self._communicator
        if communicator is None:
            raise RuntimeError("NCCL weight transfer not initialized. Call init_transfer_engine() first.")
        if self._transfer_failed:
            raise RuntimeError(
                f"the weight transfer group is unusable after a failed update ({self._transfer_failed}); call "
                "/init_weight_transfer_engine again"
            )
        metadata = self._parse_update_info(update_info)
        problem: Exception | None = None
        try:
            self.engine.check_weights([m[0] for m in metadata], [m[1] for m in metadata])
        except (ValueError, AssertionError) as exc:
            problem = exc  # still read every announced byte, so that the trainer's broadcast completes
        packed = bool(self._init_info.get("packed", False))
        buffer_size = int(self._init_info.get("packed_buffer_size_bytes", transport.DEFAULT_BUFFER_SIZE_BYTES))
        received: list[tuple[str, torch.Tensor]] = []
        bytes_before = communicator.bytes  # the group counts every byte of its lifetime
        try:
            if packed:
                for chunk in transport.receive_packed(communicator, metadata, 0, buffer_size):
                    received.extend(chunk)
            else:
                for name, shape, dtype in metadata:
                    tensor = torch.empty(shape, dtype=dtype)
                    communicator.broadcast(tensor, src=0)
                    received.append((name, tensor))
        except transport.TransportError as exc:
            self._transfer_failed = str(exc)
            raise
        if problem is not None:
            raise problem
        loaded = self.engine.load_weights(received)
        digest = combined_digest(self.engine.weight_digests())
        with self._lock:
            self.weight_updates.append({"tensors": len(received), "loaded": len(loaded), "sha256": digest})
        received_bytes = communicator.bytes - bytes_before
        logger.info("loaded %d tensors (%d bytes) from the trainer", len(received), received_bytes)
        return {"message": "Weights updated"}

    def finish_weight_update(self) -> dict:
        self._check_transfer_configured()
        with self._transfer_lock:
            if not self._update_active:
                raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
            self._update_active = False
        with self._lock:
            adapters = list(self.adapters.items())
        for name, adapter in adapters:  # vLLM applies adapters to the current base weights
            adapter.model = self._merge(adapter.config, adapter.state)
            logger.info("re-merged LoRA adapter %s onto the new base weights", name)
        return {"message": "Weight update finished"}

    # ------------------------------------------------------------ LoRA

    def load_lora_adapter(self, body: Any) -> str:
        body = body if isinstance(body, dict) else {}
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            raise ApiError(400, "1 validation error: lora_name and lora_path are required strings", "Bad Request")
        if not name or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        with self._lock:
            existing = self.adapters.get(name)
        if existing is not None and not body.get("load_inplace", False):
            raise ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if not self.enable_lora:
            raise ApiError(500, "LoRA is not enabled. Use --enable-lora to enable LoRA.", "InternalServerError")
        config_file, weights_file = Path(path) / "adapter_config.json", Path(path) / "adapter_model.safetensors"
        if not config_file.is_file() or not weights_file.is_file():
            raise ApiError(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        try:
            config, state, digest = self._read_adapter(config_file, weights_file)
            if int(config.r) > self.max_lora_rank:
                raise ApiError(
                    500,
                    f"LoRA rank {config.r} is greater than max_lora_rank {self.max_lora_rank}.",
                    "InternalServerError",
                )
            unsupported = unsupported_lora_features(config)
            if unsupported:  # vLLM's PEFTHelper refuses these (vllm/lora/peft_helper.py, 0.22 to 0.31)
                raise ApiError(500, f"Loading lora {name} failed: {' '.join(unsupported)}", "InternalServerError")
            # vLLM applies LoRA to the model's linear layers and its embeddings, matched by the module's last name
            expected = {n.rsplit(".", 1)[-1] for n, m in self.model.named_modules() if isinstance(m, torch.nn.Linear)}
            expected |= {"embed_tokens", "lm_head"}
            unexpected = unexpected_lora_modules(state, expected)
            if unexpected:
                raise ValueError(
                    f"While loading {path}, expected target modules in {sorted(expected)} but received {unexpected}. "
                    "Please verify that the loaded LoRA module is correct"
                )
            model = self._merge(config, state)
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(500, f"Loading lora {name} failed: {exc}", "InternalServerError") from exc
        with self._lock:
            previous = self.adapters.get(name)
            if previous is None:
                lora_id, count = self._next_lora_id, 1
                self._next_lora_id += 1
            else:
                lora_id, count = previous.lora_int_id, previous.load_count + 1
            self.adapters[name] = Adapter(model, path, digest, lora_id, config, state, count)
        logger.info("loaded LoRA adapter %s from %s (sha256 %s)", name, path, digest[:12])
        return f"Success: LoRA adapter '{name}' added successfully."

    @staticmethod
    def _read_adapter(config_file: Path, weights_file: Path):
        """The adapter's config and tensors, read from the same bytes that are hashed."""
        from peft import LoraConfig
        from safetensors.torch import load as load_safetensors

        data = weights_file.read_bytes()
        config = LoraConfig.from_pretrained(str(config_file.parent))
        return config, load_safetensors(data), hashlib.sha256(data).hexdigest()

    def _merge(self, config, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        """The adapter merged into a copy of the current base."""
        from peft import get_peft_model, set_peft_model_state_dict

        with self._model_lock:
            base = copy.deepcopy(self.model)
        peft_model = get_peft_model(base, copy.deepcopy(config))
        result = set_peft_model_state_dict(peft_model, state)
        if result.unexpected_keys:
            raise ValueError(f"unexpected adapter tensors: {result.unexpected_keys[:3]}")
        return peft_model.merge_and_unload().eval()

    def unload_lora_adapter(self, body: Any) -> str:
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        with self._lock:
            if self.adapters.pop(name, None) is None:
                raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return f"Success: LoRA adapter '{name}' removed successfully."

    # ------------------------------------------------------------ completions

    def _resolve_model(self, name: Any) -> tuple[torch.nn.Module, str]:
        with self._lock:
            if isinstance(name, str) and name in self.adapters:  # adapters first, as vLLM looks them up
                return self.adapters[name].model, name
        if not name or name in self.served_model_names:
            return self.model, name or self.served_model_name
        raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
            if self.tokenizer is None:
                raise ApiError(400, "text prompts need a tokenizer in the model directory")
            texts = [prompt] if isinstance(prompt, str) else prompt
            prompts = [self.tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = prompt
        else:
            raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if len(prompts) > self.max_completion_prompts:
            raise ApiError(
                400,
                f"prompt list length {len(prompts)} exceeds the maximum allowed count of "
                f"{self.max_completion_prompts}.",
                param="prompt",
            )
        for p in prompts:
            if not p or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
                raise ApiError(
                    400, "1 validation error: prompt token ids must be integers >= 0", "Bad Request", "prompt"
                )
            if max(p) >= self.vocab_size:
                raise ApiError(400, f"Token id {max(p)} is out of vocabulary", param="prompt")
        return prompts

    def _sampling(self, body: dict, prompts: list[list[int]]) -> SamplingSpec:
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
            raise ApiError(400, f"stop_token_ids must contain only integers, got {stop_ids}.", param="stop_token_ids")
        spec = SamplingSpec(
            n=_number(body, "n", 1, int),
            max_tokens=_number(body, "max_tokens", 16, int),
            temperature=_number(body, "temperature", 1.0, float),
            top_p=_number(body, "top_p", 1.0, float),
            top_k=_number(body, "top_k", 0, int),
            min_p=_number(body, "min_p", 0.0, float),
            repetition_penalty=_number(body, "repetition_penalty", 1.0, float),
            presence_penalty=_number(body, "presence_penalty", 0.0, float),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, float),
            min_tokens=_number(body, "min_tokens", 0, int),
            seed=_number(body, "seed", None, int),
            stop_token_ids=frozenset(stop_ids),
            ignore_eos=bool(body.get("ignore_eos", False)),
            logprobs=_number(body, "logprobs", None, int),
        )
        max_n = int(os.environ.get("VLLM_MAX_N_SEQUENCES", "16384"))
        unlimited = self.max_logprobs == -1
        checks = [
            (spec.n >= 1, "n", f"n must be at least 1, got {spec.n}."),
            (spec.n <= max_n, "n", f"n must be at most {max_n}, got {spec.n}."),
            (spec.temperature >= 0, "temperature", f"temperature must be non-negative, got {spec.temperature}."),
            (spec.temperature <= 2, "temperature", f"temperature must be in [0, 2], got {spec.temperature}."),
            (0 < spec.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {spec.top_p}."),
            (spec.top_k >= -1, "top_k", f"top_k must be 0 (disable), or at least 1, got {spec.top_k}."),
            (0 <= spec.min_p <= 1, "min_p", f"min_p must be in [0, 1], got {spec.min_p}."),
            (
                spec.repetition_penalty > 0,
                "repetition_penalty",
                f"repetition_penalty must be greater than zero, got {spec.repetition_penalty}.",
            ),
            (
                -2 <= spec.presence_penalty <= 2,
                "presence_penalty",
                f"presence_penalty must be in [-2, 2], got {spec.presence_penalty}.",
            ),
            (
                -2 <= spec.frequency_penalty <= 2,
                "frequency_penalty",
                f"frequency_penalty must be in [-2, 2], got {spec.frequency_penalty}.",
            ),
            (spec.max_tokens >= 1, "max_tokens", f"max_tokens must be at least 1, got {spec.max_tokens}."),
            (
                0 <= spec.min_tokens <= spec.max_tokens,
                "min_tokens",
                f"min_tokens must be in [0, max_tokens={spec.max_tokens}], got {spec.min_tokens}.",
            ),
            (spec.logprobs is None or spec.logprobs >= -1, "logprobs", "`logprobs` must be a positive value or -1."),
            (
                spec.logprobs is None or unlimited or spec.logprobs <= self.max_logprobs,
                "logprobs",
                f"Requested sample logprobs of {spec.logprobs}, which is greater than max allowed: {self.max_logprobs}",
            ),
        ]
        for ok, param, message in checks:
            if not ok:
                raise ApiError(400, message, param=param)
        if spec.temperature < GREEDY_TEMPERATURE and spec.n > 1:
            raise ApiError(400, f"n must be 1 when using greedy sampling, got {spec.n}.")
        if spec.max_tokens > self.max_model_len:
            raise ApiError(
                400,
                f"max_tokens={spec.max_tokens} cannot be greater than max_model_len=max_total_tokens="
                f"{self.max_model_len}. Please request fewer output tokens. (parameter=max_tokens, "
                f"value={spec.max_tokens})",
                param="max_tokens",
            )
        longest = max(len(p) for p in prompts)
        if longest + spec.max_tokens > self.max_model_len:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {spec.max_tokens}. This "
                f"model's maximum context length is {self.max_model_len} tokens and your request has "
                f"{longest} input tokens.",
                param="max_tokens",
            )
        return spec

    def completions(self, body: Any) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "1 validation error: the body must be a JSON object", "Bad Request")
        for key in NOT_IMPLEMENTED_FIELDS:
            if body.get(key):
                raise ApiError(400, f"`{key}` is not implemented by hf_grpo's CPU stand-in for vLLM", param=key)
        model, model_name = self._resolve_model(body.get("model"))
        prompts = self._prompts(body.get("prompt"))
        spec = self._sampling(body, prompts)
        as_ids, with_ids = bool(body.get("return_tokens_as_token_ids")), bool(body.get("return_token_ids"))
        skip_special = body.get("skip_special_tokens", True) is not False
        choices: list[dict] = []
        completion_tokens = 0
        with self._model_lock:
            for prompt in prompts:
                for sample in self.engine.sample(prompt, spec, model=model):
                    completion_tokens += len(sample.token_ids)
                    choices.append(self._choice(len(choices), prompt, sample, spec, as_ids, with_ids, skip_special))
        prompt_tokens = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }

    def _choice(self, index, prompt, sample, spec, as_ids, with_ids, skip_special) -> dict:
        ids = sample.token_ids

        def spell(token: int) -> str:
            if as_ids or self.tokenizer is None:
                return f"token_id:{token}"
            return self.tokenizer.decode([token])

        logprobs = None
        if spec.logprobs is not None:
            tokens = [spell(t) for t in ids]
            offsets, offset = [], 0
            for token in tokens:
                offsets.append(offset)
                offset += len(token)
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": [max(lp, -9999.0) for lp in sample.logprobs],
                "tokens": tokens,
                "top_logprobs": [{spell(t): max(lp, -9999.0) for t, lp, _ in step} for step in sample.top_logprobs],
            }
        return {
            "index": index,
            "text": self.engine.decode(ids, skip_special_tokens=skip_special),
            "logprobs": logprobs,
            "finish_reason": sample.finish_reason,
            "stop_reason": sample.stop_reason,
            "token_ids": list(ids) if with_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": list(prompt) if with_ids else None,
        }


# ---------------------------------------------------------------- HTTP layer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: without this, delayed ACKs add ~40 ms
    timeout = 10  # an idle keep-alive connection is closed, so no handler thread outlives the test that used it
    server: StandInHTTPServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        app, parts = self.server.app, urlsplit(self.path)
        path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            app.before_request(method, path)
            try:
                body = json.loads(raw) if raw else None
            except ValueError as exc:
                raise ApiError(400, f"1 validation error: JSON decode error: {exc}", "Bad Request", "body") from exc
            status, payload = 200, app.handle(method, path, body, query)
        except ApiError as exc:
            status, payload = exc.status, exc.body()
        except _NoRoute as exc:
            status, payload = exc.status, {"detail": exc.detail}
        except Exception as exc:
            error = api_error_from(exc)
            logger.exception("%s %s failed (HTTP %d)", method, path, error.status)
            status, payload = error.status, error.body()
        if payload is None:
            data, content_type = b"", None
        elif isinstance(payload, str):
            data, content_type = payload.encode(), "text/plain; charset=utf-8"
        else:
            data, content_type = json.dumps(payload).encode(), "application/json"
        try:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout); nothing to answer
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


def check_host(host: str) -> str:
    """The address to bind for ``--host``: loopback only."""
    if host not in LOOPBACK:
        raise ValueError(
            f"--host {host}: hf_grpo's CPU stand-in for vllm serve binds loopback addresses only {LOOPBACK}, so "
            "nothing outside this machine can reach it. Set generation.host: 127.0.0.1 for a miniature."
        )
    return "127.0.0.1" if host == "localhost" else host


class StandInHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, app: ServerApp, port: int = 0, host: str = "127.0.0.1"):
        host = check_host(host)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        self.app, self.host = app, host

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server_address[1]}"


class ThreadedServer:
    """A stand-in server running in a daemon thread of this process."""

    def __init__(self, app: ServerApp, port: int = 0, host: str = "127.0.0.1"):
        self.server = StandInHTTPServer(app, port, host)
        self.app, self.url = app, self.server.url
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ThreadedServer:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(model_dir: str | os.PathLike, *, port: int = 0, **options: Any) -> ThreadedServer:
    """Load the model and serve it from a background thread; ``options`` are ``ServerApp``'s keyword arguments."""
    return ThreadedServer(ServerApp(model_dir, **options), port)


class SubprocessServer:
    """A stand-in server in its own process (``kill()`` sends SIGKILL, like a crashed or OOM-killed ``vllm serve``)."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path):
        self.process, self.url, self.log_path = process, url, log_path

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate (SIGTERM, then SIGKILL after ``timeout``) and remove the log directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> SubprocessServer:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_subprocess(
    model_dir: str | os.PathLike,
    *,
    port: int = 0,
    served_model_name: str | None = None,
    enable_lora: bool = True,
    max_lora_rank: int = 16,
    allow_runtime_lora_updating: bool = True,
    logprobs_mode: str = "raw_logprobs",
    dev_mode: bool = False,
    extra_args: list[str] | tuple[str, ...] = (),
    startup_timeout: float = 120.0,
) -> SubprocessServer:
    """Start ``python -m hf_grpo.miniature.vllm_server`` and return once it serves (model loaded, port bound)."""
    workdir = Path(tempfile.mkdtemp(prefix="vllm-standin-"))
    ready_file, log_path = workdir / "url", workdir / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "hf_grpo.miniature.vllm_server",
        str(Path(model_dir).resolve()),
        "--port",
        str(port),
        "--max-lora-rank",
        str(max_lora_rank),
        "--logprobs-mode",
        logprobs_mode,
        "--ready-file",
        str(ready_file),
        *extra_args,
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if enable_lora:
        cmd.append("--enable-lora")
    env = {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True" if allow_runtime_lora_updating else "False",
        "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")])),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if ready_file.exists():
            return SubprocessServer(process, ready_file.read_text().strip(), log_path)
        if process.poll() is not None:
            raise RuntimeError(f"vLLM stand-in exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"vLLM stand-in did not start within {startup_timeout}s:\n{log_path.read_text()[-3000:]}")


# ---------------------------------------------------------------- command line


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hf_grpo.miniature.vllm_server",
        usage="python -m hf_grpo.miniature.vllm_server [model_tag] [options]",
        description="hf_grpo's CPU stand-in for `vllm serve` (loopback only). Takes vllm serve's flags.",
    )
    parser.add_argument("model_tag", nargs="?", help="model directory (a transformers causal LM and tokenizer)")
    parser.add_argument("--model", default=None, help="same as model_tag (model_tag wins)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback only: 127.0.0.1, localhost or ::1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (not vLLM's)")
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed of unseeded requests (default 0)")
    parser.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="raw_logprobs")
    parser.add_argument("--max-logprobs", type=int, default=20, help="-1: no limit")
    parser.add_argument("--max-model-len", type=_human_int_or_auto, default=None)
    parser.add_argument("--enable-lora", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--max-lora-rank", type=int, choices=LORA_RANKS, default=16)
    parser.add_argument("--max-loras", type=int, default=None, help="accepted, not enforced")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="no effect: float32 on CPU")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None, help="no effect on CPU")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=None, help="no effect: one CPU worker")
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=None, help="no effect: one CPU worker")
    parser.add_argument("--weight-transfer-config", type=json.loads, default=None, help='e.g. {"backend": "nccl"}')
    parser.add_argument("--ready-file", default=None, help="write the URL here once serving (not vLLM's)")
    parser.add_argument(
        "--numerics",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: serve bf16 weights, so log-probs differ from an fp32 trainer's as a bf16 vLLM's do (not vLLM's)",
    )
    return parser


def _dashes(argv: list[str]) -> list[str]:
    """vLLM's parser accepts ``--flag_name`` for ``--flag-name``."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            arg = flag.replace("_", "-") + eq + value
        out.append(arg)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``vllm serve``'s flags; exits with status 2 (as vLLM does) on an unknown flag or a bad value."""
    parser = build_parser()
    args = parser.parse_args(_dashes(list(sys.argv[1:] if argv is None else argv)))
    args.model = args.model_tag or args.model
    if not args.model:
        parser.error("the model is required (positional model_tag or --model)")
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
    try:
        args.dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        parser.error(
            f"VLLM_SERVER_DEV_MODE={os.environ['VLLM_SERVER_DEV_MODE']!r}: vLLM reads it as an integer (0 or 1)"
        )
    args.allow_runtime_lora_updating = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in (
        "1",
        "true",
    )
    return args


def no_effect_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that mean nothing on one CPU, spelled as given, with why."""
    notes = []
    for flag, why in (
        ("gpu_memory_utilization", "no GPU"),
        ("tensor_parallel_size", "one CPU worker"),
        ("data_parallel_size", "one CPU worker"),
        ("dtype", "the model runs in float32"),
        ("max_loras", "not enforced"),
    ):
        value = getattr(args, flag)
        if value is not None:
            notes.append(f"--{flag.replace('_', '-')} {value} ({why})")
    return notes


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hf_grpo.launch import apply_thread_policy

    apply_thread_policy()
    notes = no_effect_flags(args)
    if notes:
        logger.info("hf_grpo CPU stand-in for vllm serve: flags with no effect on CPU: %s", "; ".join(notes))
    if args.dev_mode:
        logger.warning("Development endpoints are enabled (VLLM_SERVER_DEV_MODE): weight transfer, server_info.")
    try:
        app = ServerApp(
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


if __name__ == "__main__":
    main()
