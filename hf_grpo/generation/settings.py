"""The recipe's ``generation:`` section: which engine generates, on which GPUs, and how weights reach it.

    generation:
      backend: vllm_server        # transformers | vllm_colocate | vllm_server | auto
      gpus: [0]                   # GPUs of the vLLM server; training gets the next num_processes GPUs
      cpus: [0]                   # vLLM's CPU build: the server's cores; training gets the others
      weight_sync: auto           # lora (adapter only, no vllm on the trainer) | full (TRL's NCCL transfer) | auto

``trl_fields`` sets the recipe's TRL fields (``use_vllm``, ``vllm_mode``, ...); ``server_command`` builds the exact
``vllm serve`` command. All keys and the weight sync modes: docs/generation.md.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import urllib.parse
from dataclasses import dataclass, field


BACKENDS = ("transformers", "vllm_colocate", "vllm_server", "auto")
WEIGHT_SYNCS = ("auto", "lora", "full")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts


@dataclass
class GenerationArguments:
    """
    The recipe's `generation:` section.

    Args:
        backend (`str`, *optional*):
            `transformers` (generation in the training process), `vllm_colocate` (TRL's vLLM engine on the training
            GPUs), `vllm_server` (a `vllm serve` process on its own GPUs, or its own CPU cores with vLLM's CPU build)
            or `auto` (`vllm_server` where this machine can run one beside training, else `transformers`; `--dry-run`
            says which and why). Unset: the TRL fields as written.
        base_url (`str`, *optional*):
            URL of a vLLM server that is already running; then none is started.
        gpus (`list[int]`, *optional*):
            GPUs of the vLLM server (default: the first `tensor_parallel_size` GPUs).
        cpus (`list[int]`, *optional*):
            With vLLM's CPU build: the CPU cores the server runs on (its processes pinned with `taskset`, its
            worker's threads bound there); the training processes run on the machine's other cores, each with at most
            that many torch threads. Unset: nobody is pinned.
        host (`str`, defaults to `"127.0.0.1"`):
            Address the server binds to. Keep loopback unless the trainer runs on another machine.
        port (`int`, defaults to `8000`):
            Server port.
        gpu_memory_utilization (`float`, *optional*):
            Fraction of GPU memory vLLM may use (default 0.9 for a dedicated server, 0.3 when colocated).
        max_model_len (`int`, *optional*):
            Longest prompt + completion the engine accepts (vLLM's default: the model's).
        tensor_parallel_size (`int`, defaults to `1`):
            GPUs one engine spans.
        data_parallel_size (`int`, defaults to `1`):
            Engines the server runs side by side (`vllm serve --data-parallel-size`); the server uses
            `tensor_parallel_size x data_parallel_size` GPUs.
        weight_sync (`str`, defaults to `"auto"`):
            `lora` (adapter only), `full` (all weights, TRL's NCCL transfer) or `auto` (`lora` with LoRA).
        server_timeout (`float`, defaults to `600.0`):
            Seconds to wait for the server to become healthy before giving up.
        request_timeout (`float`, defaults to `600.0`):
            Seconds one generation request may take before it counts as failed; one that gets no answer in that
            time is not resent (a frozen server stops the run after this long, logging every 30 s while it waits).
        max_retries (`int`, defaults to `3`):
            Retries of a request on connection errors and HTTP 429/502/503/504.
        restart_wait (`float`, defaults to `0.0`):
            Seconds to wait for a server that stopped answering to come back (restarted by you or a supervisor);
            it then gets the current adapter again and the request is sent once more. 0: the run ends at once.
        serve_command (`list[str]`, defaults to `["vllm", "serve"]`):
            Program that starts the server; the model and the flags are appended.
        extra_args (`list[str]`, *optional*):
            More `vllm serve` flags, appended as given.
        overlap (`bool`, defaults to `False`):
            `vllm_server` only: the server generates the next step's prompts while the trainer scores and trains the
            current step (one-step off-policy, as verl and NeMo RL's async GRPO). Each batch then comes from a policy
            up to `max_staleness` updates old, and TRL's vLLM importance-sampling correction reweights it
            (`vllm_importance_sampling_correction` must stay true; `vllm_importance_sampling_mode` then defaults to
            `token_truncate`). How and why: hf_grpo/generation/overlap.py.
        max_staleness (`int`, defaults to `1`):
            With `overlap`: the most optimizer steps a batch's generating policy may lag the policy at the start of
            the generation cycle that trains on it; with `c` optimizer steps per generation (`num_iterations` > 1)
            the cycle's later steps train on it up to `max_staleness + c - 1` updates after it was generated (logged
            per micro-batch as `async/staleness`). Carried dynamic-sampling groups older than this are dropped.
        seed (`int`, *optional*):
            Sampling seed base for server requests (default: the training seed). Each prompt is sent as a request
            of its own with a seed of its own (vLLM draws sample i of every prompt in a request with seed + i, so
            one seed per batch would give the i-th samples of all prompts the same noise).
    """

    backend: str | None = field(
        default=None, metadata={"help": "transformers, vllm_colocate, vllm_server or auto.", "choices": BACKENDS}
    )
    base_url: str | None = field(default=None, metadata={"help": "A running vLLM server; none is started."})
    gpus: list[int] | None = field(default=None, metadata={"help": "GPUs of the vLLM server."})
    cpus: list[int] | None = field(default=None, metadata={"help": "vLLM CPU build: the server's CPU cores."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address the server binds to."})
    port: int = field(default=8000, metadata={"help": "Server port."})
    gpu_memory_utilization: float | None = field(default=None, metadata={"help": "GPU memory fraction for vLLM."})
    max_model_len: int | None = field(default=None, metadata={"help": "Longest prompt + completion."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs one engine spans."})
    data_parallel_size: int = field(default=1, metadata={"help": "Engines side by side in the server."})
    weight_sync: str = field(default="auto", metadata={"help": "lora, full or auto.", "choices": WEIGHT_SYNCS})
    server_timeout: float = field(default=600.0, metadata={"help": "Seconds to wait for server health."})
    request_timeout: float = field(default=600.0, metadata={"help": "Seconds per generation request."})
    max_retries: int = field(default=3, metadata={"help": "Retries on transient request failures."})
    restart_wait: float = field(default=0.0, metadata={"help": "Seconds to wait for a restarted server (0: none)."})
    serve_command: list[str] = field(
        default_factory=lambda: ["vllm", "serve"], metadata={"help": "Program that starts the server."}
    )
    extra_args: list[str] | None = field(default=None, metadata={"help": "More `vllm serve` flags."})
    overlap: bool = field(
        default=False, metadata={"help": "vllm_server: generate step t+1 while step t trains (off-policy by one)."}
    )
    max_staleness: int = field(
        default=1, metadata={"help": "With overlap: most optimizer steps a batch's generating policy may lag."}
    )
    seed: int | None = field(default=None, metadata={"help": "Sampling seed base for server requests."})

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return self.base_url or f"http://{host}:{self.port}"

    def server_gpus(self) -> list[int]:
        count = self.tensor_parallel_size * self.data_parallel_size
        return list(self.gpus) if self.gpus is not None else list(range(count))

    def sync_mode(self, use_peft: bool) -> str:
        return ("lora" if use_peft else "full") if self.weight_sync == "auto" else self.weight_sync

    def starts_server(self) -> bool:
        return self.backend == "vllm_server" and self.base_url is None


def trl_fields(gen: GenerationArguments, use_peft: bool) -> dict:
    """The ``trl.GRPOConfig`` values a ``generation:`` section stands for (empty when ``backend`` is unset)."""
    if gen.backend is None:
        return {}
    if gen.backend == "transformers":
        return {"use_vllm": False}
    if gen.backend == "vllm_colocate":
        out = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_tensor_parallel_size": gen.tensor_parallel_size,
            "vllm_gpu_memory_utilization": 0.3 if gen.gpu_memory_utilization is None else gen.gpu_memory_utilization,
        }
        if gen.max_model_len is not None:
            out["vllm_max_model_length"] = gen.max_model_len
        return out
    if gen.sync_mode(use_peft) == "lora":
        return {"use_vllm": False}  # hf_grpo's own server generator (no vllm import on the trainer side)
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": gen.url,
        "vllm_server_timeout": gen.server_timeout,
    }


def check_generation(gen: GenerationArguments, use_peft: bool, lora_r: int, explicit_trl: set[str]) -> list[str]:
    """Problems with a ``generation:`` section, as messages naming the key and the fix."""
    problems = [] if gen.base_url is None else _url_problems(gen.base_url)
    if gen.overlap and (gen.backend != "vllm_server" or gen.sync_mode(use_peft) != "lora"):
        layout = f"generation.backend {gen.backend or 'unset (in-process generation)'}"
        if gen.backend == "vllm_server":
            layout = f"generation.weight_sync {gen.sync_mode(use_peft)} (TRL's NCCL transfer blocks the server)"
        problems.append(
            f"generation.overlap cannot work with {layout}: only a vLLM server on devices of its own with "
            "weight_sync: lora generates while training runs (a colocated engine shares the training devices, so "
            "one waits for the other); remove generation.overlap, or use backend: vllm_server with use_peft: true"
        )
    if gen.max_staleness < 1:
        problems.append(f"generation.max_staleness must be 1 or more optimizer steps, got {gen.max_staleness}")
    if gen.cpus is not None and (gen.backend != "vllm_server" or not gen.cpus or min(gen.cpus) < 0):
        problems.append(
            f"generation.cpus {gen.cpus} pins a vLLM server that this recipe starts to CPU cores: it needs backend "
            "vllm_server (or auto) and a list of core numbers (0, 1, ...); remove it otherwise"
        )
    if gen.backend is None:
        return problems
    clash = sorted(explicit_trl & {"use_vllm", "vllm_mode", "vllm_server_base_url"})
    if clash:
        problems.append(f"generation.backend decides {clash}; remove them from the recipe or unset generation.backend")
    if gen.backend == "vllm_server":
        if gen.starts_server() and not 1 <= gen.port <= 65535:
            problems.append(f"generation.port {gen.port} is not a TCP port: use one in 1-65535 that is free")
        for key in ("server_timeout", "request_timeout"):
            if not getattr(gen, key) > 0:  # also catches NaN
                problems.append(f"generation.{key} must be a positive number of seconds, got {getattr(gen, key)}")
        if gen.max_retries < 0:
            problems.append(f"generation.max_retries must be 0 or more, got {gen.max_retries}")
        if not gen.restart_wait >= 0:  # also catches NaN
            problems.append(f"generation.restart_wait must be 0 or more seconds, got {gen.restart_wait}")
        if gen.sync_mode(use_peft) == "lora" and not use_peft:
            problems.append("generation.weight_sync: lora needs use_peft: true (only an adapter can be synced)")
        if gen.sync_mode(use_peft) == "lora" and lora_r > LORA_RANKS[-1]:
            problems.append(f"lora_r {lora_r} is above vLLM's largest --max-lora-rank {LORA_RANKS[-1]}")
        count = gen.tensor_parallel_size * gen.data_parallel_size
        if gen.gpus is not None and len(gen.gpus) != count:
            problems.append(
                f"generation.gpus {gen.gpus} must list tensor_parallel_size x data_parallel_size = {count} GPUs"
            )
    return problems


def _url_problems(url: str) -> list[str]:
    """``generation.base_url`` is an http(s) URL with a host and a TCP port (a bad one hangs the run later)."""
    fix = "write it as http://HOST:PORT, e.g. http://127.0.0.1:8000"
    shown = repr(url) if len(url) <= 200 else f"{url[:180]!r}... ({len(url)} characters)"
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https"):
        return [f"generation.base_url {shown} must start with http:// or https://; {fix}"]
    try:
        port = parsed.port  # None when absent: http's 80, https's 443
    except ValueError:  # not a number, or above 65535
        port = -1
    if not parsed.hostname:
        return [f"generation.base_url {shown} has no host; {fix}"]
    if port is not None and not 1 <= port <= 65535:
        return [f"generation.base_url {shown} has no valid port (a TCP port is in 1-65535); {fix}"]
    return []


def max_loras(gen: GenerationArguments) -> int:
    """Adapters the server holds at once: the current one and the previous (a sync loads before it unloads), and
    with ``overlap`` also one per older policy version that may still be generating (``max_staleness``) and the one
    a sync unloads only after loading the new one."""
    return gen.max_staleness + 2 if gen.overlap else 2


def max_lora_rank(lora_r: int) -> int:
    """Smallest ``--max-lora-rank`` value vLLM accepts that holds an adapter of rank ``lora_r``."""
    return next(r for r in LORA_RANKS if r >= lora_r)


def server_command(
    gen: GenerationArguments, model: str, sync: str, lora_r: int, dtype: str | None, seed: int
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the ``vllm serve`` process for this recipe."""
    memory = 0.9 if gen.gpu_memory_utilization is None else gen.gpu_memory_utilization
    cmd = [*gen.serve_command, model, "--host", gen.host, "--port", str(gen.port)]
    cmd += ["--gpu-memory-utilization", str(memory), "--tensor-parallel-size", str(gen.tensor_parallel_size)]
    # the importance-sampling correction compares against log_softmax(logits / T): processed logprobs
    cmd += ["--seed", str(seed), "--logprobs-mode", "processed_logprobs"]
    # INFO: importing TRL (as the launcher does) sets VLLM_LOGGING_LEVEL=ERROR, which would silence the server's log
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gen.server_gpus())), "VLLM_LOGGING_LEVEL": "INFO"}
    if gen.data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(gen.data_parallel_size)]
    if gen.max_model_len is not None:
        cmd += ["--max-model-len", str(gen.max_model_len)]
    # fp32 training weights are master weights: serve the model's own dtype; float32 is named because vLLM's
    # `auto` serves a float32 checkpoint in 16 bits
    if dtype in ("bfloat16", "float16", "float32"):
        cmd += ["--dtype", dtype]
    if sync == "lora":
        cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank(lora_r)), "--max-loras", str(max_loras(gen))]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    else:  # TRL's NCCL weight transfer (see trl.generation.vllm_client)
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"}), "--max-logprobs", "-1"]
        env["VLLM_SERVER_DEV_MODE"] = "1"
    cmd += list(gen.extra_args or [])
    if gen.cpus is not None:  # vLLM's CPU build: every server process on these cores, its worker's threads bound there
        env.update(VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, gen.cpus)), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
        cmd = pinned(gen.cpus, cmd)
    return cmd, env


def training_gpus(gen: GenerationArguments, num_processes: int) -> list[int]:
    """GPU ids of the training processes on one machine: the first ones the server does not use."""
    taken = set(gen.server_gpus())
    return list(itertools.islice((gpu for gpu in itertools.count() if gpu not in taken), num_processes))


def training_cpus(gen: GenerationArguments) -> list[int]:
    """CPU cores of the training processes when the server is pinned (``generation.cpus``): this process's others."""
    return sorted(set(os.sched_getaffinity(0)) - set(gen.cpus or ()))


def pinned(cores: list[int], argv: list[str]) -> list[str]:
    """``argv`` run on ``cores`` only (``taskset``: visible in ``--dry-run``, and its children inherit it)."""
    return ["taskset", "-c", ",".join(map(str, cores)), *argv]


def format_env_command(env: dict[str, str], cmd: list[str]) -> str:
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *(shlex.quote(c) for c in cmd)])
