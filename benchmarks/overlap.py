"""Overlapped vs synchronous generation (``generation.overlap``, issue 22): the same ``vllm_server`` recipe, server and
trainer each pinned to a core of its own, runs alternating, steps/s and where each side spends its time.

    /work/venv-vllm/bin/python benchmarks/overlap.py                  # 2 runs per mode, ~12 min on 2 cores
    /work/venv-vllm/bin/python benchmarks/overlap.py --runs 3 --max-steps 16
    /work/venv-vllm/bin/python benchmarks/overlap.py --dynamic-sampling   # one more pair with dynamic sampling on

Run it with the Python whose environment has vLLM's CPU build (``python -m hf_grpo.generation.vllm_install``) to
measure real vLLM; without it the miniature's CPU stand-in server serves, and the output says which.

What it runs, and how (the output says it again next to the numbers):

- Recipe: ``recipes/qwen7b-lora-dedicated.yaml --miniature`` (a 2-layer Qwen2, LoRA r=8, adapter-only weight sync,
  DeepSpeed ZeRO-2, RLOO, beta 0.01, vLLM importance-sampling correction) through ``python -m hf_grpo.train``, i.e.
  the launcher starts the vLLM server and one training process, with ``--num_processes 1`` and batch sizes from the
  command line (``--per-device``, ``--accumulation``; ``num_generations`` is the miniature's 4). Both modes get the
  same arguments, ``--generation.overlap true`` or ``false`` (the recipe has ``true``; ``max_staleness`` 1).
- Pinning: the launcher and everything it starts run under ``taskset -c TRAINER_CORE`` with ``OMP_NUM_THREADS=1``;
  the server's command (``--generation.serve_command``) is ``taskset -c SERVER_CORE`` + the command the miniature
  uses for this vLLM, plus the CPU build's flags the launcher adds to that command (``--no-enable-chunked-prefill``);
  ``VLLM_CPU_OMP_THREADS_BIND=SERVER_CORE`` and ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` make vLLM's worker use one OpenMP
  thread on that core (its API server, engine core and worker processes all share it).
- Left out, because they add per-step time unrelated to the question: held-out evaluation (``--task_eval_steps 0``,
  ``--eval_before_after false``), checkpoints (``--save_strategy no``, ``--keep_top_k null``), trackers
  (``--report_to none``); dynamic sampling is off (``--dynamic_sampling false``) so every step generates and trains
  the same number of completions (``--dynamic-sampling`` adds a pair of runs with it on).
- Per step (``OUTPUT_DIR/training_history.json``, the trainer's ``time/*`` metrics; the first ``--warmup`` steps are
  left out: the first request loads the adapter and warms vLLM up): ``gen`` = ``time/generate``, the seconds the
  trainer waited for generation (weight sync excluded); ``sync`` = ``time/weight_sync`` (write the adapter, load it
  into the server); ``busy`` = ``time/step - time/generate``, the trainer's own work (weight sync, rewards, scoring,
  forward/backward, optimizer). ``s/step`` is wall clock: (``train_runtime`` - the warm-up steps' ``time/step``) /
  the other steps, so it counts everything in the training loop; steps/s = 1 / ``s/step``.
- Idle fractions: trainer = ``gen`` / ``s/step`` (waiting for the server). Server = 1 - ``server`` / ``s/step``, where
  ``server`` is the server's generation seconds per step: in a synchronous run ``gen`` (the trainer waits exactly
  while the server generates), in an overlapped run the trainer's ``time/server_generate`` (from sending the step's
  requests, in the background thread, to their last answer; HTTP and JSON included, as in ``gen``).
- Ratio = overlapped steps/s / synchronous steps/s (means over runs); ideal = (G + T) / max(G, T) with G the
  synchronous runs' ``gen`` and T their ``s/step - gen``. The acceptance bar of issue 22: ratio >= 1.5 when G and T
  are within a factor of 2 of each other; the output says whether they are.
- The other users of these cores are not controlled: the load average is printed before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hf_grpo.generation.vllm_install import find_vllm


REPO = Path(__file__).resolve().parent.parent
RECIPE = "recipes/qwen7b-lora-dedicated.yaml"
STANDIN_MODULE = "hf_grpo.vllm_standin"
FIXED_ARGS = [
    "--miniature",
    "--num_processes",
    "1",
    "--task_eval_steps",
    "0",
    "--keep_top_k",
    "null",
    "--eval_before_after",
    "false",
    "--save_strategy",
    "no",
    "--report_to",
    "none",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per mode, alternating sync, overlap, sync, ...")
    parser.add_argument("--max-steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of per-step figures")
    parser.add_argument("--per-device", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--accumulation", type=int, default=4, help="gradient_accumulation_steps")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--trainer-core", type=int, default=1)
    parser.add_argument("--dynamic-sampling", action="store_true", help="one more sync/overlap pair with it on")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--workdir", default=None, help="run outputs and logs (default: a new temp dir)")
    return parser.parse_args()


def server_setup(core: int) -> tuple[list[str], list[str], str]:
    """(serve_command, extra_args, description): this Python's vLLM CPU build pinned to ``core``, else the stand-in."""
    installed = find_vllm()
    pin = ["taskset", "-c", str(core)]
    if installed.runs_on_cpu:
        return [*pin, *installed.serve_command()], installed.server_flags(), f"real {installed.describe()}"
    why = installed.describe()
    return [*pin, sys.executable, "-m", STANDIN_MODULE], [], f"the CPU stand-in server (vLLM here: {why})"


def run_command(args, out: Path, overlap: bool, dynamic: bool, server) -> tuple[list[str], dict[str, str]]:
    serve_command, extra_args, _ = server
    argv = ["taskset", "-c", str(args.trainer_core), sys.executable, "-m", "hf_grpo.train", RECIPE, *FIXED_ARGS]
    argv += ["--generation.serve_command", json.dumps(serve_command), "--output_dir", str(out)]
    if extra_args:
        argv += ["--generation.extra_args", json.dumps(extra_args)]
    argv += ["--max_steps", str(args.max_steps), "--dynamic_sampling", str(dynamic).lower()]
    argv += ["--per_device_train_batch_size", str(args.per_device)]
    argv += ["--gradient_accumulation_steps", str(args.accumulation)]
    argv += ["--generation.overlap", "true" if overlap else "false"]  # the recipe's own value is true
    env = {
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(args.server_core),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "HF_HUB_OFFLINE": "1",
    }
    return argv, env


def launch(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int, float]:
    """Run the launcher in a process group of its own; on timeout SIGTERM it (it stops the server and training)."""
    start = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = -1
    return rc, time.perf_counter() - start


def summarize(history: list[dict], warmup: int, completions: int) -> dict:
    """Means over the steps after ``warmup`` of the trainer's per-step metrics, and the wall-clock seconds per step."""
    steps = [r for r in history if "time/step" in r]
    runtime = next(r["train_runtime"] for r in history if "train_runtime" in r)
    kept = steps[warmup:]
    if not kept:
        raise ValueError(f"only {len(steps)} steps logged, none after the {warmup} warm-up steps")

    def mean(key: str) -> float:
        values = [r[key] for r in kept if key in r]
        return statistics.fmean(values) if values else float("nan")

    wall = (runtime - sum(r["time/step"] for r in steps[:warmup])) / len(kept)
    out = {k: mean(f"time/{k}") for k in ("step", "generate", "weight_sync", "reward", "score", "train")}
    out["tokens"] = mean("completions/mean_length") * completions  # completion tokens per step
    out["staleness"] = mean("async/staleness")
    out["server"] = mean("time/server_generate")  # overlap runs: send -> last answer of the step's rounds
    return {**out, "wall": wall, "steps": len(kept)}


def one_run(args, workdir: Path, index: int, overlap: bool, dynamic: bool, server) -> dict:
    mode = ("overlap" if overlap else "sync") + (" +DS" if dynamic else "")
    out = workdir / f"run{index}-{mode.replace(' +', '-')}"
    argv, env = run_command(args, out, overlap, dynamic, server)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"[run {index}] {mode}: load average {load}; log {out}.log", flush=True)
    rc, seconds = launch(argv, env, Path(f"{out}.log"), args.timeout)
    if rc != 0:
        print(f"[run {index}] {mode}: FAILED (exit {rc}) after {seconds:.0f} s; see {out}.log", flush=True)
        return {"mode": mode, "failed": True}
    history = json.loads((out / "training_history.json").read_text())
    row = {
        "mode": mode,
        "index": index,
        "total": seconds,
        "load": load,
        **summarize(history, args.warmup, args.per_device * args.accumulation),
    }
    print(
        f"[run {index}] {mode}: {row['wall']:.3f} s/step ({1 / row['wall']:.3f} steps/s), gen {row['generate']:.3f} s, "
        f"whole run incl. server start {seconds:.0f} s",
        flush=True,
    )
    return row


def print_table(rows: list[dict]) -> None:
    head = f"{'run':>3} {'mode':<11} {'s/step':>7} {'steps/s':>7} {'gen':>6} {'sync':>6} {'reward':>6} {'score':>6}"
    head += f" {'train':>6} {'busy':>6} {'server':>6} {'idle T':>6} {'idle S':>6} {'stale':>5} {'load avg':>15}"
    print(head)
    for r in rows:
        busy = r["step"] - r["generate"]
        # sync: the server generates exactly while the trainer waits; overlap: measured send -> last answer
        server = r["generate"] if r["server"] != r["server"] else r["server"]  # NaN: not an overlap run
        print(
            f"{r['index']:>3} {r['mode']:<11} {r['wall']:>7.3f} {1 / r['wall']:>7.3f} {r['generate']:>6.3f} "
            f"{r['weight_sync']:>6.3f} {r['reward']:>6.3f} {r['score']:>6.3f} {r['train']:>6.3f} {busy:>6.3f} "
            f"{server:>6.3f} {r['generate'] / r['wall']:>6.1%} {1 - min(server / r['wall'], 1):>6.1%} "
            f"{r['staleness']:>5.2f} {r['load']:>15}"
        )


def report(rows: list[dict], args, server_text: str) -> None:
    print(f"\nserver: {server_text}, pinned to core {args.server_core}; trainer pinned to core {args.trainer_core}")
    print(
        f"per step: {args.per_device * args.accumulation} completions ({args.per_device} x {args.accumulation} "
        f"accumulation, 4 per prompt); {args.max_steps} steps per run, the first {args.warmup} left out"
    )
    print(
        "columns: s/step wall clock; gen = trainer's wait for generation; sync = weight sync; busy = time/step - gen;"
    )
    print("  server = the server's generation seconds per step: sync runs, gen (the trainer waits exactly that long);")
    print("  overlap runs, time/server_generate (from sending the step's requests to their last answer)")
    print("  idle T = gen / s/step; idle S = 1 - server / s/step (capped at 0: an overlap round can span steps)")
    print("  stale = async/staleness (mean lag of the generating policy, in updates)\n")
    for dynamic in (False, True):
        group = [r for r in rows if r["mode"].endswith("+DS") == dynamic and not r.get("failed")]
        sync = [r for r in group if r["mode"].startswith("sync")]
        over = [r for r in group if r["mode"].startswith("overlap")]
        if not sync or not over:
            continue
        gen = statistics.fmean(r["generate"] for r in sync)
        train = statistics.fmean(r["wall"] - r["generate"] for r in sync)
        print_table(group)
        rate_sync = statistics.fmean(1 / r["wall"] for r in sync)
        rate_over = statistics.fmean(1 / r["wall"] for r in over)
        ideal = (gen + train) / max(gen, train)
        balance = max(gen, train) / min(gen, train)
        print(
            f"\n{'dynamic sampling on' if dynamic else 'dynamic sampling off'}: sync {rate_sync:.3f} steps/s, "
            f"overlap {rate_over:.3f} steps/s, ratio {rate_over / rate_sync:.2f}x; ideal (G+T)/max(G,T) = "
            f"({gen:.3f} + {train:.3f}) / {max(gen, train):.3f} = {ideal:.2f}x"
        )
        within = "within" if balance <= 2 else "NOT within"
        print(
            f"  G (generation) {gen:.3f} s/step and T (the rest) {train:.3f} s/step: {balance:.2f}x apart, {within} 2x"
        )
        each = ", ".join(f"{(1 / r['wall']) / rate_sync:.2f}" for r in over)
        print(f"  ratio per overlap run (its steps/s / the mean sync steps/s): {each}\n")


def main() -> None:
    args = parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="overlap-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = server_setup(args.server_core)
    print(f"server: {server[2]}; workdir {workdir}", flush=True)
    plan = [(overlap, False) for _ in range(args.runs) for overlap in (False, True)]
    if args.dynamic_sampling:
        plan += [(False, True), (True, True)]
    rows = [one_run(args, workdir, i, overlap, dynamic, server) for i, (overlap, dynamic) in enumerate(plan)]
    report(rows, args, server[2])


if __name__ == "__main__":
    main()
