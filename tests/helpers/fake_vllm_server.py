"""The CPU stand-in for ``vllm serve`` (``hf_grpo.vllm_standin``) with test-only controls, in a thread or a process.

``FixtureApp`` is the stand-in's ``ServerApp`` plus routes under ``/fixture/`` (never counted, delayed or failed
themselves):

- ``GET /fixture/adapters``: ``{"adapters": {name: {lora_path, sha256, lora_int_id, load_count}}}``;
- ``GET /fixture/stats``: ``{"requests": {"METHOD /path": count}}``;
- ``GET /fixture/weights``: ``{"sha256": {name: engine.tensor_digest}}`` of the served base weights;
- ``GET /fixture/weight_updates``: one record per ``/update_weights`` (tensors received and loaded, the weights'
  combined digest after it);
- ``POST /fixture/fail`` ``{"count", "status", "path"}``: fail the next requests (to ``path``, or any) with ``status``;
- ``POST /fixture/delay`` ``{"seconds", "count", "path"}``: hold the next requests (``count`` None: all);
- ``POST /fixture/reset`` ``{"adapters": bool}``: clear the counts and plans (and the adapters).

    with start_in_thread(model_dir, enable_lora=True) as server: ...   # server.url
    server = start_subprocess(model_dir); ...; server.kill()           # a process that can be SIGKILLed
    python -m tests.helpers.fake_vllm_server MODEL [vllm serve flags]  # the stand-in's command line
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hf_grpo.vllm_standin import cli
from hf_grpo.vllm_standin.engine import combined_digest
from hf_grpo.vllm_standin.errors import ApiError
from hf_grpo.vllm_standin.server import Routes, ServerApp, StandInHTTPServer


REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.helpers.fake_vllm_server"


class FixtureApp(ServerApp):
    """``ServerApp`` that counts requests, injects delays and failures, and answers the ``/fixture/`` routes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._fixture_lock = threading.Lock()
        self.weight_updates: list[dict] = []
        self.reset()

    def reset(self, adapters: bool = False) -> None:
        with self._fixture_lock:
            self.counts: Counter[str] = Counter()
            self.fail_plan: dict | None = None
            self.delay_plan: dict | None = None
        if adapters:
            with self.lora.lock:
                self.lora.adapters.clear()

    def handle(self, method: str, path: str, body: Any, query: dict[str, str] | None = None) -> Any:
        if not path.startswith("/fixture/"):
            self._before_request(method, path)
        return super().handle(method, path, body, query)

    def _before_request(self, method: str, path: str) -> None:
        """Count the request, then apply an injected delay and an injected failure (in that order)."""
        delay, fail = 0.0, None
        with self._fixture_lock:
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

    def routes(self, body: Any, query: dict[str, str]) -> Routes:
        routes = super().routes(body, query)
        if "/update_weights" in routes:
            routes["/update_weights"] = ("POST", lambda: self._update_weights(body))
        body = body if isinstance(body, dict) else {}
        routes["/fixture/adapters"] = ("GET", self._adapters)
        routes["/fixture/stats"] = ("GET", lambda: {"requests": dict(self.counts)})
        routes["/fixture/weights"] = ("GET", lambda: {"sha256": self.engine.weight_digests()})
        routes["/fixture/weight_updates"] = ("GET", lambda: {"updates": list(self.weight_updates)})
        routes["/fixture/fail"] = ("POST", lambda: self._plan("fail", body))
        routes["/fixture/delay"] = ("POST", lambda: self._plan("delay", body))
        routes["/fixture/reset"] = ("POST", lambda: self._reset(body))
        return routes

    def _update_weights(self, body: Any) -> dict:
        answer = self.weights.update(body)
        record = {**self.weights.last_update, "sha256": combined_digest(self.engine.weight_digests())}
        with self._fixture_lock:
            self.weight_updates.append(record)
        return answer

    def _reset(self, body: dict) -> dict:
        self.reset(adapters=bool(body.get("adapters", False)))
        return {"ok": True}

    def _adapters(self) -> dict:
        return {
            "adapters": {
                name: {
                    "lora_path": a.path,
                    "sha256": a.sha256,
                    "lora_int_id": a.lora_int_id,
                    "load_count": a.load_count,
                }
                for name, a in self.lora.items()
            }
        }

    def _plan(self, kind: str, body: dict) -> dict:
        with self._fixture_lock:
            if kind == "fail":
                self.fail_plan = {
                    "count": int(body.get("count", 1)),
                    "status": int(body.get("status", 503)),
                    "path": body.get("path"),
                }
            else:
                count = body.get("count")
                self.delay_plan = {
                    "seconds": float(body.get("seconds", 1.0)),
                    "path": body.get("path"),
                    "count": None if count is None else int(count),
                }
        return {"ok": True}


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
    return ThreadedServer(FixtureApp(model_dir, **options), port)


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
    """Start ``python -m tests.helpers.fake_vllm_server`` and return once it serves (model loaded, port bound)."""
    workdir = Path(tempfile.mkdtemp(prefix="vllm-standin-"))
    ready_file, log_path = workdir / "url", workdir / "server.log"
    cmd = [sys.executable, "-m", MODULE, str(Path(model_dir).resolve()), "--port", str(port)]
    cmd += ["--max-lora-rank", str(max_lora_rank), "--logprobs-mode", logprobs_mode, "--ready-file", str(ready_file)]
    cmd += [*extra_args, *(["--served-model-name", served_model_name] if served_model_name else [])]
    cmd += ["--enable-lora"] if enable_lora else []
    env = {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True" if allow_runtime_lora_updating else "False",
        "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
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


if __name__ == "__main__":
    cli.main(app_class=FixtureApp, prog=f"python -m {MODULE}")
