"""The stand-in for ``vllm serve``: vLLM 0.30's routes and JSON over HTTP on loopback, a transformers model behind.

``ServerApp`` answers ``/health``, ``/v1/models``, ``/v1/completions`` (``completions``), the LoRA routes (``lora``)
and, with ``dev_mode``, the development and weight-transfer routes TRL 1.16's ``VLLMClient`` calls (``weights``);
``StandInHTTPServer`` binds loopback only. ``python -m hf_grpo.vllm_standin`` starts it. Routes: docs/vllm_protocol.md.

    server = StandInHTTPServer(ServerApp("path/to/model", enable_lora=True), port=0)
    server.serve_forever()  # server.url: http://127.0.0.1:PORT
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import torch

from .completions import CompletionRoute
from .engine import SamplingEngine
from .errors import ApiError, NoRoute, api_error_from
from .lora import AdapterStore
from .transport import LOOPBACK_HOSTS
from .weights import WeightReceiver


logger = logging.getLogger("hf_grpo.vllm_standin.server")

Routes = dict[str, tuple[str, Callable[[], Any]]]  # path: (method, handler)


class ServerApp:
    """The model, the adapters, the weight transfer and the routes, independent of HTTP."""

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
        names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or [])
        self.served_model_names = names or [str(model_dir)]
        self.served_model_name, self.model_dir = self.served_model_names[0], str(model_dir)
        self.max_model_len, self.max_logprobs = self.engine.max_model_len, max_logprobs
        self.logprobs_mode, self.seed, self.dev_mode = logprobs_mode, seed, dev_mode
        self.allow_runtime_lora_updating = allow_runtime_lora_updating
        # one generation or weight load at a time (the engine's lock): deterministic, gentle on CPUs
        self.lora = AdapterStore(self.engine.model, self.engine.lock, enable_lora, max_lora_rank)
        self.weights = WeightReceiver(self.engine, weight_transfer_config, on_finish=self.lora.remerge)
        self.completions = CompletionRoute(
            self.engine, self.lora, self.served_model_names, max_logprobs, max_completion_prompts
        )

    def routes(self, body: Any, query: dict[str, str]) -> Routes:
        """The routes this server answers, each bound to the request's body and query."""
        routes: Routes = {
            "/health": ("GET", lambda: None),
            "/v1/models": ("GET", self.list_models),
            "/v1/completions": ("POST", lambda: self.completions(body)),
        }
        if self.allow_runtime_lora_updating:
            routes["/v1/load_lora_adapter"] = ("POST", lambda: self.lora.load(body))
            routes["/v1/unload_lora_adapter"] = ("POST", lambda: self.lora.unload(body))
        if self.dev_mode:
            routes["/server_info"] = ("GET", lambda: self.server_info(query))
            routes["/get_world_size"] = ("GET", lambda: {"world_size": 1})
            routes["/reset_prefix_cache"] = ("POST", lambda: {"success": True})
            routes["/init_weight_transfer_engine"] = ("POST", lambda: self.weights.init(body))
            routes["/start_weight_update"] = ("POST", self.weights.start)
            routes["/update_weights"] = ("POST", lambda: self.weights.update(body))
            routes["/finish_weight_update"] = ("POST", self.weights.finish)
        return routes

    def handle(self, method: str, path: str, body: Any, query: dict[str, str] | None = None) -> Any:
        """Returns None (empty 200), a str (text/plain 200) or a JSON-able object (200); raises on errors."""
        routes = self.routes(body, query or {})
        if path not in routes:
            raise NoRoute(404, "Not Found")
        expected, handler = routes[path]
        if method != expected:
            raise NoRoute(405, "Method Not Allowed")
        return handler()

    def list_models(self) -> dict:
        t = int(time.time())
        rows = [(name, self.model_dir, None, self.max_model_len) for name in self.served_model_names]
        rows += [(name, a.path, self.served_model_name, None) for name, a in self.lora.items()]
        cards = [
            {"id": i, "object": "model", "created": t, "owned_by": "vllm", "root": r, "parent": p, "max_model_len": m}
            for i, r, p, m in rows
        ]
        return {"object": "list", "data": cards}

    def server_info(self, query: dict[str, str]) -> dict:
        """vLLM's ``/server_info``: the resolved config (``config_format=json``: a tree, else its text)."""
        config_format = query.get("config_format", "text")
        if config_format not in ("text", "json"):
            raise ApiError(400, f"config_format must be 'text' or 'json', got {config_format!r}", "Bad Request")
        parallel = dict.fromkeys(
            ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "world_size"), 1
        )
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
            "parallel_config": parallel,
            "device_config": {"device": "cpu"},
            "lora_config": {"max_lora_rank": self.lora.max_lora_rank} if self.lora.enable_lora else None,
            "weight_transfer_config": self.weights.config,
            "additional_config": {"hf_grpo_cpu_standin": True},
        }
        env = {
            "VLLM_SERVER_DEV_MODE": self.dev_mode,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": self.allow_runtime_lora_updating,
        }
        system = {"torch_version": torch.__version__, "is_cuda_available": False, "platform": sys.platform}
        text = ", ".join(f"{k}={v}" for k, v in config.items())
        return {"vllm_config": config if config_format == "json" else text, "vllm_env": env, "system_env": system}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: without this, delayed ACKs add ~40 ms
    timeout = 10  # an idle keep-alive connection is closed, so no handler thread outlives the test that used it
    server: StandInHTTPServer

    def _answer(self, method: str, path: str, query: dict[str, str]) -> tuple[int, Any]:
        """(status, payload) of the request, errors answered as vLLM answers them."""
        try:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError as exc:
                raise ApiError(400, f"1 validation error: JSON decode error: {exc}", "Bad Request", "body") from exc
            return 200, self.server.app.handle(method, path, body, query)
        except ApiError as exc:
            return exc.status, exc.body()
        except NoRoute as exc:
            return exc.status, {"detail": exc.detail}
        except Exception as exc:
            error = api_error_from(exc)
            logger.exception("%s %s failed (HTTP %d)", method, path, error.status)
            return error.status, error.body()

    def _dispatch(self) -> None:  # GET and POST alike: self.command is the method
        parts = urlsplit(self.path)
        status, payload = self._answer(self.command, parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()})
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

    do_GET = do_POST = _dispatch

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


def check_host(host: str) -> str:
    """The address to bind for ``--host``: loopback only."""
    if host not in LOOPBACK_HOSTS:
        raise ValueError(
            f"--host {host}: hf_grpo's CPU stand-in for vllm serve binds loopback addresses only {LOOPBACK_HOSTS}, so "
            "nothing outside this machine can reach it. Set generation.host: 127.0.0.1 for a miniature."
        )
    return "127.0.0.1" if host == "localhost" else host


class StandInHTTPServer(ThreadingHTTPServer):
    """``app`` served over HTTP on a loopback address, one thread per connection; ``port=0`` picks a free port."""

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
