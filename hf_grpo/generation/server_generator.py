"""Generation through a vLLM server with adapter-only LoRA weight sync (no vllm import on the trainer side).

``hf_grpo.GRPOTrainer`` calls, once per optimizer step, ``sync(trainer)``: the main process writes the current
LoRA adapter as safetensors to ``adapter_dir/step-<N>`` (gathering ZeRO-3 shards first), loads it into the server
as ``policy-<N>`` and unloads the previous one; every process waits for that before generating. Only the current
and the previous adapter stay on disk (a 7B r16 adapter is ~40 MB; one per step would be 40 GB over 1,000 steps). ``generate`` then
sends each process's prompts (one request per batch, ``n`` samples per distinct prompt) and returns the completion
token ids and sampled-token log-probabilities, which TRL uses for its importance-sampling correction.

Syncing under a new name each step keeps vLLM's prefix cache, which is keyed by adapter name, from reusing blocks
computed with older weights (vllm issue #42125).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import shutil
from pathlib import Path

import requests
from accelerate.utils import gather_object
from peft import get_peft_model_state_dict
from safetensors.torch import save_file

from .vllm_client import VLLMConnectionError, VLLMServerClient, VLLMServerError


logger = logging.getLogger(__name__)

ADAPTER_FILE = "adapter_model.safetensors"


def save_adapter(trainer, path: Path) -> str | None:
    """Write the trainer's LoRA adapter to ``path`` (main process); returns the sha256 of its safetensors file."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    gather = contextlib.nullcontext()
    if trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        lora = [p for name, p in model.named_parameters() if "lora_" in name]
        gather = deepspeed.zero.GatheredParameters(lora, modifier_rank=None)  # collective: every process enters
    with gather:
        if not trainer.accelerator.is_main_process:
            return None
        state = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, path / ADAPTER_FILE)
    model.peft_config["default"].save_pretrained(path)
    with open(path / ADAPTER_FILE, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# vLLM seeds sample i of an n-sample request with seed + i; one generate call's prompts take seed + j * n + i, and
# a call's P * n samples stay below this
SEED_STRIDE = 2**20


def request_seed(base: int, step: int, call: int | str, process: int) -> int:
    """The seed of one request: distinct per (base, step, call within the step, process), and spaced so that the
    ``seed + i`` of its samples never meet another request's. (``base + step + process`` made process 1's sample j
    repeat process 0's sample j + 1, and every dynamic-sampling round and evaluation of a step repeat the first.)"""
    digest = hashlib.sha256(f"{base}/{step}/{call}/{process}".encode()).digest()
    return int.from_bytes(digest[:4], "little") * SEED_STRIDE  # < 2**52


class ServerGenerator:
    """Generates for ``hf_grpo.GRPOTrainer`` through a vLLM server, syncing only the LoRA adapter."""

    def __init__(
        self,
        url: str,
        adapter_dir: str | Path,
        request_timeout: float = 600.0,
        max_retries: int = 3,
        server_timeout: float = 600.0,
        seed: int | None = None,
        check_logprobs: bool = True,
        restart_wait: float = 0.0,
        max_staleness: int | None = None,
    ):
        self.client = VLLMServerClient(url, request_timeout=request_timeout, max_retries=max_retries)
        self.url, self.adapter_dir, self.server_timeout, self.seed = url, Path(adapter_dir), server_timeout, seed
        self.check_logprobs = check_logprobs  # False for a server our launcher started with processed_logprobs
        self.restart_wait = restart_wait  # seconds a server that stopped answering may take to come back
        self.max_staleness = max_staleness  # generation.overlap: None (synchronous) or its staleness bound
        self.adapter_name: str | None = None
        self.synced_step = -1
        self.loaded: dict[str, Path] = {}  # adapter name -> its directory, for every adapter the server holds
        self.adapter_sha256: str | None = None  # of the adapter the server serves now (main process)
        self.extra_body: dict = {}  # generation_kwargs and structured outputs, set by connect()
        self.sampling: dict = {}  # the trainer's sampling settings, set by connect()
        self.process_index = 0  # this process's, set by connect(): part of every request's seed
        self._calls, self._calls_step = 0, None  # requests in the current step (rounds, evaluation)

    def connect(self, trainer) -> None:
        """Wait (bounded) for the server on the main process, then release the others."""
        if trainer.accelerator.is_main_process:
            self.client.wait_until_healthy(timeout_s=self.server_timeout)
            if self.check_logprobs and trainer.vllm_importance_sampling_correction:
                self.check_logprobs_mode()
        trainer.accelerator.wait_for_everyone()
        self.process_index = trainer.accelerator.process_index
        self.sampling = {  # TRL's sampling settings, as its vLLM engines get them
            "max_tokens": trainer.max_completion_length,
            "temperature": trainer.temperature,
            "top_p": trainer.top_p,
            "top_k": trainer.top_k or None,
            "min_p": trainer.min_p or 0.0,
            "repetition_penalty": trainer.repetition_penalty,
            "stop_token_ids": list(trainer.eos_token_ids),
        }
        # what TRL forwards to its vLLM engines, forwarded here too (vLLM's completions API takes both in the body)
        self.extra_body = dict(trainer.args.generation_kwargs or {})
        if trainer.args.vllm_structured_outputs_regex:
            self.extra_body["structured_outputs"] = {"regex": trainer.args.vllm_structured_outputs_regex}

    def check_logprobs_mode(self) -> str | None:
        """TRL's start-up check, which a generator bypasses: the importance-sampling correction needs the server's
        log-probs after temperature and logit processing. Warns (as TRL does) and returns the server's mode."""
        try:
            response = self.client.session.get(f"{self.url}/server_info", params={"config_format": "json"}, timeout=30)
        except requests.RequestException as exc:
            logger.warning("could not read the vLLM server's --logprobs-mode (%s)", exc)
            return None
        if response.status_code != 200:
            logger.warning(
                "the vLLM server at %s does not say its --logprobs-mode (GET /server_info: HTTP %d; it needs "
                "VLLM_SERVER_DEV_MODE=1). Start it with --logprobs-mode processed_logprobs, or the importance-sampling "
                "correction is biased; set vllm_importance_sampling_correction: false otherwise",
                self.url,
                response.status_code,
            )
            return None
        mode = response.json().get("vllm_config", {}).get("model_config", {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            logger.warning(
                "the vLLM server at %s runs with --logprobs-mode %s, which biases the importance-sampling correction: "
                "restart it with --logprobs-mode processed_logprobs, or set vllm_importance_sampling_correction: false",
                self.url,
                mode,
            )
        return mode

    def sync(self, trainer, in_use: set[str] = frozenset()) -> bool:
        """Load the current adapter into the server if the policy changed since the last sync, then unload every
        older adapter except those in ``in_use`` (overlapped generation: requests still generating with them)."""
        step = trainer.state.global_step
        if step == self.synced_step:
            return False
        name, path = f"policy-{step}", self.adapter_dir / f"step-{step}"
        # every process's rounds in flight: the main process unloads, and another rank's round may still generate
        in_use = set().union(*gather_object([sorted(in_use)]))
        sha256 = save_adapter(trainer, path)
        if trainer.accelerator.is_main_process:
            self._send_once_more_after_restart(self.client.load_lora_adapter, name, str(path.resolve()), reload=False)
            for old in [n for n in self.loaded if n != name and n not in in_use]:  # a restart mid-loop: waited for
                self._send_once_more_after_restart(self.client.unload_lora_adapter, old, reload=False, missing_ok=True)
            self.adapter_sha256 = sha256
            logger.debug("server now serves %s (sha256 %s)", name, sha256)
            # delete the adapter directories the server no longer serves (older runs' too)
            keep = {p.name for n, p in self.loaded.items() if n in in_use} | {path.name, f"step-{self.synced_step}"}
            for folder in self.adapter_dir.glob("step-*"):
                if folder.name not in keep and folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
        # every process: what the server holds, to load it again after a restart
        self.loaded = {n: p for n, p in self.loaded.items() if n in in_use} | {name: path}
        self.adapter_name, self.synced_step = name, step
        return True

    def generate(
        self,
        prompt_ids: list[list[int]],
        num_generations: int,
        step: int,
        adapter: str | None = None,
        seed_key: tuple[int, str] | None = None,
    ):
        """(completion_ids, logprobs) for ``prompt_ids``, one completion per row, in order, at optimizer step ``step``
        (sampled with the settings ``connect`` read from the trainer).

        Consecutive identical prompts (a group, or the part of it this process holds) become one prompt with ``n``
        samples, so the server shares their prefill. ``adapter`` (default: the current one) and ``seed_key``
        (``(step, call)``; default: this step and its count of calls so far) are set by overlapped generation, which
        generates for a later step from another thread.
        """
        adapter = adapter or self.adapter_name
        runs = [(ids, len(list(group))) for ids, group in itertools.groupby(prompt_ids)]  # (prompt, n) per run
        samples: list[list[tuple[list[int], list[float]]]] = [[] for _ in runs]  # per run: (ids, logprobs) x n
        for n in sorted({count for _, count in runs}):  # one request per distinct n (usually exactly one)
            chosen = [i for i, (_, count) in enumerate(runs) if count == n]
            seeds = None
            if self.seed is not None:  # each prompt its own seed: a shared one gives their i-th samples one noise
                if seed_key is None:
                    self._calls = self._calls + 1 if self._calls_step == step else 0
                    self._calls_step = step
                    seed_key = (step, str(self._calls))
                seed = request_seed(self.seed, seed_key[0], seed_key[1], self.process_index)
                if len(chosen) * n > SEED_STRIDE:
                    raise ValueError(f"{len(chosen)} prompts x {n} samples exceed one call's {SEED_STRIDE} seeds")
                seeds = [seed + j * n for j in range(len(chosen))]
            result = self._send_once_more_after_restart(
                self.client.generate,
                [runs[i][0] for i in chosen],
                n=n,
                seeds=seeds,
                model=adapter,
                extra_body=self.extra_body,
                **self.sampling,
            )
            for j, i in enumerate(chosen):  # the response is prompt-major: sample k of prompt j is at j * n + k
                rows = slice(j * n, (j + 1) * n)
                samples[i] = list(zip(result.completion_ids[rows], result.logprobs[rows], strict=True))
        completion_ids = [list(ids) for run in samples for ids, _ in run]
        logprobs = [list(lps) for run in samples for _, lps in run]
        return completion_ids, logprobs

    def _send_once_more_after_restart(self, send, *args, reload: bool = True, **kwargs):
        """``send(*args, **kwargs)``; when the server restarted, load the adapter the request names (``model``) into
        it again and send once more. A restart shows as a 404 for the adapter (the new server never loaded it) or,
        while it starts, as no answer: waited for up to ``restart_wait`` seconds (0: that error ends the run as
        before)."""
        adapter = kwargs.get("model") or self.adapter_name
        try:
            return send(*args, **kwargs)
        except VLLMServerError as exc:
            if exc.status != 404 or adapter is None or not reload:
                raise
            why = f"the vLLM server at {self.url} no longer serves {adapter}"
        except VLLMConnectionError as exc:
            if not self.restart_wait > 0:
                raise
            logger.warning(
                "%s; waiting up to %.0f s for it to come back (generation.restart_wait)", exc, self.restart_wait
            )
            self.client.wait_until_healthy(timeout_s=self.restart_wait)
            why = f"the vLLM server at {self.url} is back"
        if reload and adapter is not None:  # load_inplace: several processes at once are harmless
            logger.warning("%s: loading %s into it again and sending the request once more", why, adapter)
            path = self.loaded.get(adapter, self.adapter_dir / f"step-{self.synced_step}")
            self.client.load_lora_adapter(adapter, str(path.resolve()))
        return send(*args, **kwargs)
