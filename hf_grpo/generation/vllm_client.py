"""HTTP client for a ``vllm serve`` server: token-id generation with sampled logprobs, and LoRA adapter hot-loading.

The GRPO trainer generates through a vLLM OpenAI-compatible server running on other GPUs. With LoRA only the adapter
is synced: the trainer saves it (safetensors) to a directory the server can read, asks the server to (re)load it, then
generates with ``model=<adapter name>``. This module does that over plain HTTP with ``requests`` and never imports
vllm, so it runs on the trainer side and on CPU-only machines.

Usage::

    client = VLLMServerClient("http://127.0.0.1:8000", request_timeout=300, max_retries=3)
    client.wait_until_healthy(timeout_s=240)
    client.load_lora_adapter("policy-10", "/shared/adapters/step-10")  # a new name per sync (prefix cache: see the docs)
    out = client.generate([[151644, 872], [151644, 77]], n=8, max_tokens=256, temperature=1.0, model="policy-10")
    client.unload_lora_adapter("policy-9", missing_ok=True)
    out.completion_ids   # P*n lists of token ids, prompt-major: the 8 samples of prompt 0 first
    out.logprobs         # P*n lists, the logprob of each sampled token
    out.to_trl()         # the dict trl's VLLMClient.generate returns (logprobs shaped (P*n, len, 1))

The server's command: ``generation.settings.server_command``. The protocol facts this client relies on, with where
in vLLM each was read: ``docs/vllm_client_protocol.md``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests


logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
_TRANSIENT_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
_CHECKS = "Check that `vllm serve` is running (read its log), the host and port, and any firewall in between."
HEARTBEAT_S = 30.0  # a wait on the server logs a line this often


@contextlib.contextmanager
def still_waiting(what: str, limit_s: float, every_s: float | None = None):
    """Log ``still waiting for <what>: N s of <limit_s> s`` every ``every_s`` (``HEARTBEAT_S``) seconds until the
    block ends."""
    done, start, every_s = threading.Event(), time.monotonic(), every_s or HEARTBEAT_S

    def beat() -> None:
        while not done.wait(every_s):
            logger.info("still waiting for %s: %.0f s of %.0f s", what, time.monotonic() - start, limit_s)

    thread = threading.Thread(target=beat, name="vllm-wait-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class VLLMServerError(RuntimeError):
    """The server answered with an HTTP error (a 4xx/500 at once, or a retryable status after the last retry)."""

    def __init__(self, message: str, *, url: str, status: int | None = None, error_type: str | None = None):
        super().__init__(message)
        self.url, self.status, self.error_type = url, status, error_type


class VLLMConnectionError(ConnectionError):
    """The server could not be reached, or did not answer in time, within the retry budget."""


@dataclass
class GenerationResult:
    """Completions for P prompts x n samples, prompt-major (index p*n+i is sample i of prompt p)."""

    n: int
    prompt_ids: list[list[int]]  # (P, prompt_len_p), as the server saw them
    completion_ids: list[list[int]]  # (P*n, completion_len_j), EOS/stop token included when one ended the sequence
    logprobs: list[list[float]]  # (P*n, completion_len_j): sampled-token logprobs, NaN where the server gave none
    finish_reasons: list[str | None]  # (P*n,): "stop" or "length"
    texts: list[str] = field(default_factory=list)  # (P*n,)
    usage: dict[str, int] = field(default_factory=dict)

    def to_trl(self) -> dict[str, list]:
        """The dict TRL's ``VLLMClient.generate`` returns with ``logprobs=0``; logprobs shaped (P*n, len, 1)."""
        return {
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "logprobs": [[[None if math.isnan(lp) else lp] for lp in seq] for seq in self.logprobs],
            "logprob_token_ids": [[[tok] for tok in seq] for seq in self.completion_ids],
        }


class VLLMServerClient:
    """Talks to one ``vllm serve`` process; each thread that uses it gets an HTTP session of its own.

    Every request gets ``max_retries`` retries with exponential backoff (``backoff * 2**k`` seconds, capped at
    ``max_backoff``) on connection errors, timeouts and HTTP 429/502/503/504; other 4xx and 500 raise at once with the
    server's message. One attempt waits at most ``connect_timeout`` to connect and ``request_timeout`` between bytes
    of the answer, so a dead or hung server raises within ``worst_case_s`` seconds.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        request_timeout: float = 300.0,
        connect_timeout: float = 10.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_prompts_per_request: int = 1024,
        max_concurrent_requests: int = 64,
    ):
        self.base_url = base_url.rstrip("/")
        self.request_timeout, self.connect_timeout = request_timeout, connect_timeout
        self.max_retries, self.backoff, self.max_backoff = max(0, max_retries), backoff, max_backoff
        self.max_prompts_per_request = max_prompts_per_request
        self.max_concurrent_requests = max_concurrent_requests  # generate(seeds=...): one request per prompt
        self._local, self._sessions, self._sessions_lock = threading.local(), [], threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # kept: its threads' sessions (and connections) are reused
        self._base_model: str | None = None

    @property
    def session(self) -> requests.Session:
        """This thread's HTTP session (``generate`` with per-prompt seeds sends from several threads)."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            with self._sessions_lock:
                self._sessions.append(session)
        return session

    @property
    def worst_case_s(self) -> float:
        """Upper bound on how long one call can take before it raises (not counting a server that trickles bytes)."""
        sleeps = sum(min(self.max_backoff, self.backoff * 2**k) for k in range(self.max_retries))
        # only connection failures are retried; a request that got no answer (read timeout) is not
        return (self.max_retries + 1) * self.connect_timeout + self.request_timeout + sleeps

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._sessions_lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()
        self._local = threading.local()

    # ---------------------------------------------------------------- HTTP plumbing

    def _request(self, method: str, path: str, payload: dict | None = None) -> requests.Response:
        url = f"{self.base_url}{path}"
        start, attempts = time.monotonic(), self.max_retries + 1
        for attempt in range(attempts):
            response, retry_after = None, None
            try:
                with still_waiting(f"the vLLM server to answer {method} {path}", self.request_timeout):
                    response = self.session.request(
                        method, url, json=payload, timeout=(self.connect_timeout, self.request_timeout)
                    )
            except requests.ReadTimeout as exc:  # connected, then no answer: resending would wait as long again
                raise VLLMConnectionError(
                    f"vLLM server at {self.base_url} accepted {method} {path} but did not answer within "
                    f"request_timeout {self.request_timeout:g}s ({type(exc).__name__}); a request is not resent to a "
                    f"server that stopped answering. {_CHECKS}"
                ) from None
            except _TRANSIENT_ERRORS as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in RETRY_STATUSES:
                    raise self._http_error(response, method, path)
                message, error_type = _error(response)
                last = f"HTTP {response.status_code}: {message}"
                retry_after = _retry_after(response)
            if attempt + 1 < attempts:
                delay = min(self.max_backoff, retry_after if retry_after is not None else self.backoff * 2**attempt)
                logger.warning(
                    "%s %s failed (%s); retry %d/%d in %.1fs", method, url, last, attempt + 1, self.max_retries, delay
                )
                time.sleep(delay)
        elapsed = time.monotonic() - start
        if response is not None:  # the last attempt got a retryable status
            raise VLLMServerError(
                f"vLLM server at {self.base_url} still answered {method} {path} with {last} after {attempts} "
                f"attempts over {elapsed:.1f}s. The server is overloaded or restarting; {_CHECKS}",
                url=url,
                status=response.status_code,
                error_type=error_type,
            )
        raise VLLMConnectionError(
            f"vLLM server at {self.base_url} did not answer {method} {path} after {attempts} attempts over "
            f"{elapsed:.1f}s (last error: {last}). {_CHECKS}"
        )

    def _http_error(self, response: requests.Response, method: str, path: str) -> VLLMServerError:
        message, error_type = _error(response)
        hint = ""
        if response.status_code == 404 and path.endswith("_lora_adapter") and message == "Not Found":
            hint = (
                " The server does not expose runtime LoRA loading: start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
                " in its environment and --enable-lora --max-lora-rank R."
            )
        return VLLMServerError(
            f"vLLM server at {self.base_url} rejected {method} {path}: HTTP {response.status_code}: {message}{hint}",
            url=response.url,
            status=response.status_code,
            error_type=error_type,
        )

    # ---------------------------------------------------------------- endpoints

    def health(self) -> bool:
        """True when ``GET /health`` answers 200 (one try, a few seconds at most)."""
        try:
            timeout = (self.connect_timeout, min(self.request_timeout, 5.0))
            return self.session.get(f"{self.base_url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def wait_until_healthy(self, timeout_s: float = 240.0, poll_interval_s: float = 1.0) -> None:
        """Poll ``/health`` until it answers 200; raise ``VLLMConnectionError`` after ``timeout_s`` seconds."""
        start = time.monotonic()
        deadline, last = start + timeout_s, "no answer"
        while True:
            remaining = deadline - time.monotonic()
            try:
                timeout = (max(0.1, min(self.connect_timeout, remaining)), max(0.1, min(5.0, remaining)))
                status = self.session.get(f"{self.base_url}/health", timeout=timeout).status_code
                if status == 200:
                    return
                last = f"HTTP {status}"
            except requests.RequestException as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + poll_interval_s > deadline:
                raise VLLMConnectionError(
                    f"vLLM server at {self.base_url} was not healthy after waiting {time.monotonic() - start:.1f}s "
                    f"(timeout {timeout_s}s; last /health result: {last}). {_CHECKS} A large model can take minutes "
                    "to load: raise the timeout if its log shows it still loading."
                )
            time.sleep(poll_interval_s)

    def models(self) -> list[dict[str, Any]]:
        """The cards of ``GET /v1/models``: base model(s) first, then loaded adapters (with ``parent`` set)."""
        return self._request("GET", "/v1/models").json()["data"]

    @property
    def base_model(self) -> str:
        """Served name of the base model (the first card without a parent), fetched once."""
        if self._base_model is None:
            cards = self.models()
            self._base_model = next((c["id"] for c in cards if not c.get("parent")), cards[0]["id"])
        return self._base_model

    def load_lora_adapter(self, name: str, path: str | os.PathLike, *, load_inplace: bool = True) -> str:
        """(Re)load the PEFT adapter saved in directory ``path`` under ``name``; returns the server's message.

        ``load_inplace`` replaces an adapter already loaded under ``name`` and makes a retried request harmless; to
        sync a policy prefer a new name per step (see the prefix-cache caveat in the module docstring). ``path`` must
        be readable at the same location on the server's machine.
        """
        payload = {"lora_name": name, "lora_path": os.path.abspath(os.fspath(path)), "load_inplace": load_inplace}
        return self._request("POST", "/v1/load_lora_adapter", payload).text

    def unload_lora_adapter(self, name: str, *, missing_ok: bool = False) -> str:
        """Unload adapter ``name``; with ``missing_ok`` an unknown name (404) is not an error."""
        try:
            return self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name}).text
        except VLLMServerError as exc:
            if missing_ok and exc.status == 404:
                return ""
            raise

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int = 1,
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        model: str | None = None,
        stop_token_ids: list[int] | None = None,
        extra_body: dict[str, Any] | None = None,
        seeds: list[int] | None = None,
    ) -> GenerationResult:
        """Sample ``n`` completions for each token-id prompt; ``model`` is an adapter name or None for the base.

        ``top_k`` None, 0 or -1 means no top-k. ``extra_body`` is merged into each request (e.g. ``ignore_eos``).
        Prompts are sent in chunks of ``max_prompts_per_request``; the result keeps the input order.

        Seeds: vLLM draws sample i of every prompt of a request with ``seed + i``, so one ``seed`` makes the i-th
        samples of different prompts share their noise. ``seeds`` (one per prompt) sends each prompt as a request of
        its own with its own seed, ``max_concurrent_requests`` at a time so that the server still batches them.
        """
        if seeds is not None:
            if seed is not None or len(seeds) != len(prompt_ids):
                raise ValueError("pass either seed or one seed per prompt (seeds), not both")
            kwargs = dict(n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p)
            kwargs |= dict(repetition_penalty=repetition_penalty, model=model, stop_token_ids=stop_token_ids)
            return self._generate_each(prompt_ids, seeds, kwargs, extra_body)
        if not prompt_ids or not all(isinstance(p, list) and p for p in prompt_ids):
            raise ValueError("prompt_ids must be a non-empty list of non-empty token-id lists")
        if n < 1 or max_tokens < 1:
            raise ValueError(f"n and max_tokens must be >= 1, got n={n}, max_tokens={max_tokens}")
        payload: dict[str, Any] = {
            "model": model or self.base_model,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": 0 if top_k is None or top_k < 0 else top_k,
            "min_p": min_p,
            "repetition_penalty": repetition_penalty,
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **({"seed": seed} if seed is not None else {}),
            **({"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}),
            **(extra_body or {}),
        }
        result = GenerationResult(n=n, prompt_ids=[], completion_ids=[], logprobs=[], finish_reasons=[])
        for start in range(0, len(prompt_ids), self.max_prompts_per_request):
            chunk = prompt_ids[start : start + self.max_prompts_per_request]
            body = self._request("POST", "/v1/completions", {**payload, "prompt": chunk}).json()
            self._add_choices(result, chunk, body)
        return result

    def _generate_each(self, prompt_ids, seeds, kwargs, extra_body) -> GenerationResult:
        """One request per prompt with its own seed, sent concurrently; the results in prompt order."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_concurrent_requests, thread_name_prefix="vllm-request")
        parts = list(
            self._pool.map(lambda p, s: self.generate([p], seed=s, extra_body=extra_body, **kwargs), prompt_ids, seeds)
        )
        result = GenerationResult(n=kwargs["n"], prompt_ids=[], completion_ids=[], logprobs=[], finish_reasons=[])
        for part in parts:
            for name in ("prompt_ids", "completion_ids", "logprobs", "finish_reasons", "texts"):
                getattr(result, name).extend(getattr(part, name))
            for key, value in part.usage.items():
                result.usage[key] = result.usage.get(key, 0) + value
        return result

    def _add_choices(self, result: GenerationResult, chunk: list[list[int]], body: dict[str, Any]) -> None:
        n, choices = result.n, sorted(body["choices"], key=lambda c: c["index"])
        if len(choices) != len(chunk) * n:
            raise VLLMServerError(f"expected {len(chunk)} x {n} choices, got {len(choices)}", url=self.base_url)
        for j, choice in enumerate(choices):
            ids = choice.get("token_ids")
            if ids is None:
                raise VLLMServerError("no choices[].token_ids: the server ignored return_token_ids", url=self.base_url)
            logprobs = choice.get("logprobs") or {}
            lps = [math.nan if lp is None else float(lp) for lp in logprobs.get("token_logprobs") or []]
            token_ids = [_token_id(t) for t in logprobs.get("tokens") or []]
            if len(lps) != len(ids) or (token_ids and None not in token_ids and token_ids != ids):
                raise VLLMServerError(
                    f"choice {choice['index']}: logprobs do not line up with token_ids", url=self.base_url
                )
            if j % n == 0:
                result.prompt_ids.append(choice.get("prompt_token_ids") or chunk[j // n])
            result.completion_ids.append(ids)
            result.logprobs.append(lps)
            result.finish_reasons.append(choice.get("finish_reason"))
            result.texts.append(choice.get("text", ""))
        for key, value in (body.get("usage") or {}).items():
            if isinstance(value, int):
                result.usage[key] = result.usage.get(key, 0) + value


def _token_id(token: str) -> int | None:
    return int(token[len("token_id:") :]) if token.startswith("token_id:") else None


def _error(response: requests.Response) -> tuple[str, str | None]:
    """(message, error type) of an error answer."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    error = body.get("error")
    error_type = error.get("type") if isinstance(error, dict) else None
    if isinstance(error, dict) and "message" in error:  # vLLM: {"error": {"message", "type", "param", "code"}}
        return str(error["message"]), error_type
    if "message" in body:  # older flat shape
        return str(body["message"]), error_type
    if "detail" in body:  # FastAPI default, e.g. a route that is not registered
        return str(body["detail"]), error_type
    return response.text.strip()[:500] or response.reason or "no body", error_type


def _retry_after(response: requests.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None
