"""Start a ``vllm serve`` process, wait until it is healthy (bounded), and stop it however training ends.

    with VLLMServerProcess(cmd, env, url, log_path, timeout_s=600) as server:
        run_training()          # the server is terminated on exit, on error and on SIGINT/SIGTERM of the parent

The server runs in its own process group, so stopping it also stops the engine workers it spawned; its output goes
to ``log_path``, whose last lines are quoted when it fails to start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from ..base.watchdog import ask_group_to_stop
from .vllm_client import VLLMServerClient, still_waiting


logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class VLLMServerProcess:
    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str],
        url: str,
        log_path: str | Path,
        timeout_s: float,
        on_start: Callable[[int], None] | None = None,
    ):
        """``on_start``: called with the server's pid (its process group's id) as soon as it is started."""
        self.cmd, self.env, self.url = cmd, env, url.rstrip("/")
        self.log_path, self.timeout_s, self.on_start = Path(log_path), timeout_s, on_start
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self._check_port_free()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting the vLLM server (log: %s): %s", self.log_path, " ".join(self.cmd))
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.cmd,
                # unbuffered: vLLM logs to stdout, which a file would hold back until the (killed) server flushes it
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if self.on_start is not None:
            self.on_start(self.process.pid)

    def _check_port_free(self) -> None:
        """Something already answering on the port (a leftover server) would pass for ours: refuse to start."""
        address = urlsplit(self.url)
        try:
            with socket.create_connection((address.hostname, address.port), timeout=2.0):
                pass
        except OSError:
            return  # nothing listens there: ours can bind it
        raise ServerStartError(
            f"{address.hostname}:{address.port} already accepts connections (a server left from an earlier run?): "
            f"stop it (e.g. `fuser -k {address.port}/tcp`), or set generation.port to a free port"
        )

    def wait_healthy(self) -> None:
        client = VLLMServerClient(self.url, connect_timeout=5.0, request_timeout=5.0)
        deadline = time.monotonic() + self.timeout_s
        what = f"the vLLM server at {self.url} to become healthy (generation.server_timeout; log: {self.log_path})"
        with contextlib.closing(client), still_waiting(what, self.timeout_s):
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServerStartError(
                        f"the vLLM server exited with code {self.process.returncode} before becoming healthy at "
                        f"{self.url}. Last lines of {self.log_path}:\n{_tail(self.log_path)}"
                    )
                if client.health():
                    logger.info("vLLM server healthy at %s", self.url)
                    return
                time.sleep(1.0)
        raise ServerStartError(
            f"the vLLM server at {self.url} was not healthy after {self.timeout_s:.0f} s (generation.server_timeout). "
            f"Check {self.log_path} (model download, GPU memory: generation.gpu_memory_utilization, port in use). "
            f"Last lines:\n{_tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 30.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            logger.info("stopping the vLLM server (pid %d)", self.process.pid)
            try:
                ask_group_to_stop(self.process.pid)  # SIGTERM, and SIGCONT for a stopped server
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            except ProcessLookupError:
                pass
        # the engine workers the server spawned share its group and may outlive it (or a leader that is already gone)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> VLLMServerProcess:  # noqa: PYI034
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop(grace_s=5.0)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
