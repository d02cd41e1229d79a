"""Speed on a real model, side by side in one run: stock ``trl.GRPOTrainer`` and hf_grpo on the same model, data and
sampling settings (HF generate for both), then hf_grpo with its vLLM server, synchronous and overlapped.

    python benchmarks/real_model_speed.py                                   # 4 arms x 6 steps of the recipe
    /work/venv-vllm/bin/python benchmarks/real_model_speed.py --steps 8 --warmup 2
    python benchmarks/real_model_speed.py --arms stock,hf_grpo --run-args "--per_device_train_batch_size 16"

What it runs, and how (the output prints this section again after the numbers):

- Every arm: ``load_recipe`` of ``--recipe`` + ``--max_steps --output_dir WORKDIR/ARM --dynamic_sampling false
  --eval_before_after false --task_eval_steps 0`` (stock TRL has no dynamic sampling: with it off every arm generates
  and trains as many completions per step), the arm's generation keys, then ``--run-args``; the recipe's seed, env.
- stock, hf_grpo: a subprocess each (this file, ``--child``), ``--generation.backend transformers`` (HF generate),
  threads by ``apply_thread_policy`` as in ``hf_grpo.train``. stock: ``load_grpo_datasets`` + ``fit_to_context`` (as
  ``build_trainer``), ``load_policy``, ``trl.GRPOTrainer`` with a ``trl.GRPOConfig`` of every ``GRPOConfig`` field
  of the recipe's training config (fields that differ afterwards are printed), the recipe's reward functions as
  plain in-process functions, ``trl.get_peft_config``. hf_grpo: ``build_trainer(recipe)`` (our subclass, isolated
  reward workers). For both, s/step = one callback's ``on_step_begin`` -> ``on_step_end``; the same wrappers on the
  trainer instance time TRL's ``_generate`` (gen; tokens: the completion ids it returns), ``_calculate_rewards``
  (reward) and ``_prepare_inputs`` (score = it - gen - reward; train = s/step - it). trainMB: ``ru_maxrss``.
- vllm_sync, vllm_overlap: ``python -m hf_grpo.train`` as a user runs it, by the Python with vLLM's CPU build (this
  one or ``--vllm-python``), ``--generation.backend vllm_server --generation.overlap false|true --generation.port
  FREE``; the recipe's ``generation.cpus`` pins the server, training gets the other cores. Phases: the trainer's
  ``time/*`` (``training_history.json``; they cover ``training_step``: the optimizer step is in none; gen excludes
  sync); s/step = (``train_runtime`` - warm-up steps' ``time/step``) / other steps, as ``benchmarks/overlap.py``.
  trainMB: ``VmHWM`` of the training process (under accelerate), read every 0.5 s.
- server: the server's generation s/step (sync: gen; overlap: ``time/server_generate``, its requests' send -> last
  answer); tok/st: completion tokens per step (vLLM arms: ``completions/mean_length`` x completions per step);
  tok/s: tokens / server seconds (HF arms: / gen). rt s/st: (``train_runtime`` - warm-up steps) / other steps.
- workMB, servMB: peak summed RSS, sampled every 0.5 s, of the training process's descendants (reward workers) and
  of the vLLM API server with all its descendants (shared pages count once per process).
- Left out: the first ``--warmup`` steps of every mean; model load, server start (outside ``train()``). Threads and
  cores differ between the HF arms and the vLLM arms (printed): compare stock with hf_grpo, sync with overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil


sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/limits.py, beside this file
import limits


REPO = Path(__file__).resolve().parent.parent
ARMS = ("stock", "stock_tuned", "hf_grpo", "hf_grpo_plain", "vllm_sync", "vllm_overlap")
IN_PROCESS_ARMS = ("stock", "stock_tuned", "hf_grpo", "hf_grpo_plain")
# stock: TRL's defaults for what only changes speed (activation checkpointing on, the whole batch in one micro-batch as
# the recipe ran before its speed settings); stock_tuned: the recipe's own values of those TRL settings
STOCK_SPEED = {"gradient_checkpointing": True, "activation_checkpointing": True, "gradient_accumulation_steps": 1}
PHASES = ("generate", "weight_sync", "reward", "score", "train")
IN_PROCESS = ["--generation.backend", "transformers", "--generation.overlap", "false", "--generation.cpus", "null"]
MIB = 2**20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m-arith.yaml")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per arm")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each arm left out of every mean")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--vllm-python", default=None, help="Python with vLLM's CPU build (default: this one)")
    parser.add_argument("--workdir", default=None, help="outputs, logs, JSON (default: a new temp dir)")
    parser.add_argument("--run-args", default="", help='more recipe overrides for every arm: "--key value ..."')
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one arm may take")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: run one in-process arm
    return parser.parse_args()


# ---------------------------------------------------------------------------------------------------------------------
# Child side: the stock and hf_grpo arms, each in a process of its own.


def step_timer(trainer):
    """A TrainerCallback timing each optimizer step, with phase wrappers set on ``trainer`` (the same for both)."""
    from transformers import TrainerCallback  # here: the reward fork server imports this module

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps, self.phases, self.began = [], defaultdict(float), None
            for name, phase in (("_generate", "generate"), ("_calculate_rewards", "reward"), ("_prepare_inputs", "p")):
                setattr(trainer, name, self.timed(phase, getattr(trainer, name)))

        def timed(self, phase, fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    out = fn(*args, **kwargs)
                finally:
                    self.phases[phase] += time.perf_counter() - start
                if phase == "generate":  # (prompt_ids, completion_ids, ...)
                    self.phases["tokens"] += sum(len(ids) for ids in out[1])
                    self.calls.append(generate_call(out[0], out[1]))
                return out

            return wrapper

        def on_step_begin(self, args, state, control, **kwargs):
            self.phases, self.began, self.calls = defaultdict(float), time.perf_counter(), []

        def on_step_end(self, args, state, control, **kwargs):
            step, p = time.perf_counter() - self.began, self.phases
            score = max(p["p"] - p["generate"] - p["reward"], 0.0)
            record = {"step": step, "generate": p["generate"], "weight_sync": 0.0, "reward": p["reward"]}
            record |= {"score": score, "train": step - p["p"], "tokens": p["tokens"], "calls": self.calls}
            self.steps.append(record)

    return StepTimer()


def generate_call(prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> dict:
    """The shape of one generate call: rows, distinct prompts, padded prompt length, decode steps (the longest)."""
    return {
        "rows": len(prompt_ids),
        "groups": len({tuple(ids) for ids in prompt_ids}),
        "prompt": max(len(ids) for ids in prompt_ids),
        "completion": max(len(ids) for ids in completion_ids),
    }


def step_costs(trainer, recipe, step: dict) -> dict:
    """The FLOPs one step's training executed and the bytes and FLOPs its generation had to (benchmarks/limits.py)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    rank = recipe.model.lora_r if recipe.model.use_peft else 0
    shapes = limits.Shapes.of(model.config, sum(p.numel() for p in model.parameters()), rank)
    shared = getattr(trainer, "_shared_prompts", False)
    recompute = bool(trainer.args.gradient_checkpointing)
    costs = {"train_flops": 0.0, "gen_bytes": 0.0, "gen_flops": 0.0}
    for call in step["calls"]:
        rows, groups, prompt, completion = call["rows"], call["groups"], call["prompt"], call["completion"]
        costs["train_flops"] += limits.train_flops(shapes, rows, prompt, completion, groups, shared, recompute)
        read, flops = limits.decode_cost(shapes, rows, prompt, completion)
        costs["gen_bytes"] += read
        costs["gen_flops"] += flops
    return costs


def build_stock(recipe, tuned: bool = False):
    """(trl.GRPOTrainer, GRPOConfig fields that differ from the recipe's, close). Not ``tuned``: TRL's default speed
    settings (``STOCK_SPEED``) with the generation batch in one micro-batch; ``tuned``: the recipe's."""
    import trl

    from hf_grpo.data import load_grpo_datasets
    from hf_grpo.rewards import resolve_reward
    from hf_grpo.run.pipeline import fit_to_context, load_policy

    args, kwargs = recipe.training, recipe.rewards.reward_kwargs or {}
    train_dataset, _ = load_grpo_datasets(recipe.data, seed=args.seed)
    model, tokenizer = load_policy(recipe)
    train_dataset, _ = fit_to_context(recipe, model, tokenizer, train_dataset, None)
    names = [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init]
    values = {name: getattr(args, name) for name in names}
    # __post_init__ derived one of the two from the other; TRL refuses both set
    values["steps_per_generation" if "generation_batch_size" in recipe.values else "generation_batch_size"] = None
    if not tuned:
        batch = args.per_device_train_batch_size * args.steps_per_generation  # one generation, one micro-batch
        values |= {k: v for k, v in STOCK_SPEED.items() if k in values}
        values |= {"per_device_train_batch_size": batch, "steps_per_generation": None, "generation_batch_size": None}
    config = trl.GRPOConfig(**values)
    differ = [name for name in names if getattr(config, name) != getattr(args, name)]
    rewards = []
    for name in recipe.rewards.reward_funcs:
        fn = resolve_reward(name)
        rewards.append(functools.update_wrapper(functools.partial(fn, **kwargs[name]), fn) if name in kwargs else fn)
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=rewards,
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=trl.get_peft_config(recipe.model),
    )
    return trainer, differ, lambda: None


def build_ours(recipe):
    from hf_grpo.run.pipeline import build_trainer

    trainer, evaluator, _ = build_trainer(recipe)
    return trainer, [], (evaluator.close if evaluator is not None else lambda: None)


def child_main(spec_file: str) -> None:
    import logging

    from hf_grpo.launch.launcher import apply_thread_policy
    from hf_grpo.recipe import apply_env, load_recipe

    spec = json.loads(Path(spec_file).read_text())
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    recipe, _ = load_recipe(spec["argv"], for_run=True)
    apply_env(recipe)
    threads = apply_thread_policy()
    peak = {"matmul": limits.matmul_flops(threads), "bandwidth": limits.read_bandwidth(threads)}  # before the model
    if spec["arm"].startswith("stock"):
        trainer, differ, close = build_stock(recipe, tuned=spec["arm"] == "stock_tuned")
    else:
        trainer, differ, close = build_ours(recipe)
    timer = step_timer(trainer)
    trainer.add_callback(timer)
    try:
        output = trainer.train()
    finally:
        close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    steps = [{**step, **step_costs(trainer, recipe, step)} for step in timer.steps]
    result = {"steps": steps, "runtime": output.metrics["train_runtime"], "trainer_rss": rss, "peak": peak}
    result |= {"threads": threads, "cores": sorted(os.sched_getaffinity(0)), "differ": differ}
    Path(spec["out"]).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------------------------------
# Parent side


class Sampler(threading.Thread):
    """Every 0.5 s, the process tree under ``root``: peak summed RSS of the vLLM server's tree, peak VmHWM of the
    training process (``root`` itself, or the ``-m hf_grpo.train`` process under accelerate), peak summed RSS of the
    training process's descendants, and the CPU affinity of the trainer and the server."""

    def __init__(self, root: int, trainer_is_root: bool):
        super().__init__(daemon=True)
        self.root, self.trainer_is_root, self.done = root, trainer_is_root, threading.Event()
        self.peak, self.cores = {"server": 0, "trainer": 0, "workers": 0}, {}

    def run(self) -> None:
        while not self.done.wait(0.5):
            with contextlib.suppress(psutil.Error, OSError):
                self.sample()

    def sample(self) -> None:
        root, procs, kids = psutil.Process(self.root), {}, defaultdict(list)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                procs[proc.pid] = (proc.ppid(), proc.cmdline(), proc.memory_info().rss)
                kids[procs[proc.pid][0]].append(proc.pid)

        def tree(pid: int) -> list[int]:
            return [pid, *(p for kid in kids[pid] for p in tree(kid))]

        def tops(match) -> list[int]:  # matching processes whose parent does not match (a fork's copy does)
            hits = {pid for pid, (_, cmd, _) in procs.items() if pid != self.root and match(cmd)}
            return [pid for pid in hits if procs[pid][0] not in hits]

        def trainer(cmd) -> bool:
            return "hf_grpo.train" in cmd and not any(Path(a).name == "accelerate" for a in cmd)

        servers = tops(lambda cmd: any("vllm.entrypoints" in a for a in cmd))
        self.bump("server", sum(procs[p][2] for s in servers for p in tree(s)))
        for pid in [self.root] if self.trainer_is_root else tops(trainer):
            hwm = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
            self.bump("trainer", int(hwm.group(1)) * 1024 if hwm else 0)
            self.bump("workers", sum(procs[p][2] for p in tree(pid)[1:]))
            self.cores.setdefault("trainer", psutil.Process(pid).cpu_affinity())
        for pid in servers:
            self.cores.setdefault("server", psutil.Process(pid).cpu_affinity())

    def bump(self, key: str, value: int) -> None:
        self.peak[key] = max(self.peak[key], value)


def launch(argv: list[str], env: dict, log: Path, timeout: float, trainer_is_root: bool) -> tuple[int, Sampler]:
    """Run ``argv`` in a process group of its own, sampled; on timeout or Ctrl-C SIGTERM it, then SIGKILL the group."""
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        sampler = Sampler(proc.pid, trainer_is_root)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if isinstance(exc, KeyboardInterrupt):
                raise
            rc = -1
        finally:
            sampler.done.set()
            sampler.join()
    return rc, sampler


def summarize(steps: list[dict], runtime: float, warmup: int, callback_wall: bool) -> dict:
    """Means over the steps after ``warmup``; wall s/step from the callback (first arms) or from ``train_runtime``."""
    kept = steps[warmup:]
    if not kept:
        raise ValueError(f"only {len(steps)} steps, none after the {warmup} warm-up steps")
    runtime_wall = (runtime - sum(s["step"] for s in steps[:warmup])) / len(kept)
    out = {k: statistics.fmean(s[k] for s in kept) for k in ("step", *PHASES)}
    server = [s.get("server") for s in kept]
    out["server"] = statistics.fmean(server) if None not in server else out["generate"]
    gen_seconds = sum(s["server"] if s.get("server") is not None else s["generate"] for s in kept)
    out["tokens"] = statistics.fmean(s["tokens"] for s in kept)
    out["tok_s"] = sum(s["tokens"] for s in kept) / gen_seconds if gen_seconds else float("nan")
    return {**out, "wall": out["step"] if callback_wall else runtime_wall, "rt_wall": runtime_wall, "kept": len(kept)}


def history_steps(out: Path, completions: int) -> tuple[list[dict], float]:
    """Per-step records (``time/*``) and ``train_runtime`` from a run's ``training_history.json``."""
    history = json.loads((out / "training_history.json").read_text())
    steps = [
        {**{k: r.get(f"time/{k}", 0.0) for k in ("step", *PHASES)}, "server": r.get("time/server_generate")}
        | {"tokens": r["completions/mean_length"] * completions}
        for r in history
        if "time/step" in r
    ]
    return steps, next(r["train_runtime"] for r in history if "train_runtime" in r)


def run_arm(arm: str, ctx: dict, args) -> dict:
    """One arm: its command, run and sampled; returns its table row (``failed`` when it did not finish)."""
    out, log = ctx["workdir"] / arm, ctx["workdir"] / f"{arm}.log"
    argv = [args.recipe, "--max_steps", str(args.steps), "--output_dir", str(out), *ctx["common"]]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    row = {"arm": arm, "load": load, "log": str(log)}
    if arm in IN_PROCESS_ARMS:
        spec, result_file = ctx["workdir"] / f"{arm}.spec.json", ctx["workdir"] / f"{arm}.result.json"
        plain = ["--shared_prompts", "false"] if arm == "hf_grpo_plain" else []
        arm_argv = [*argv, *IN_PROCESS, *plain, *ctx["extra"]]
        spec.write_text(json.dumps({"arm": arm, "argv": arm_argv, "out": str(result_file)}))
        command, env = [sys.executable, __file__, "--child", str(spec)], {**ctx["env"], **ctx["recipe"].env}
    else:
        from hf_grpo.launch.launcher import free_port

        overlap = "true" if arm == "vllm_overlap" else "false"
        gen = ["--generation.backend", "vllm_server", "--generation.overlap", overlap, "--generation.port"]
        command = [ctx["vllm_python"], "-m", "hf_grpo.train", *argv, *gen, str(free_port()), *ctx["extra"]]
        # as an activated venv: the launcher's `taskset -c CORES accelerate ...` looks accelerate up on PATH only
        env = {**ctx["env"], "PATH": os.pathsep.join([str(Path(ctx["vllm_python"]).parent), ctx["env"]["PATH"]])}
    row["command"] = shlex.join(command)
    print(f"[{arm}] load average {load}; log {log}", flush=True)
    start = time.perf_counter()
    rc, sampler = launch(command, env, log, args.timeout, trainer_is_root=arm in IN_PROCESS_ARMS)
    row["seconds"], peak = time.perf_counter() - start, sampler.peak
    if rc != 0:
        print(f"[{arm}] FAILED (exit {rc}) after {row['seconds']:.0f} s; see {log}", flush=True)
        return {**row, "failed": True}
    row |= {"server_rss": peak["server"], "workers_rss": peak["workers"], "trainer_rss": peak["trainer"]}
    if arm in IN_PROCESS_ARMS:
        result = json.loads(result_file.read_text())
        row |= summarize(result["steps"], result["runtime"], args.warmup, callback_wall=True)
        row |= {"trainer_rss": result["trainer_rss"], "differ": result["differ"]}
        row |= limits.ratios(result["steps"][args.warmup :], result["peak"])
        row["threads"] = f"trainer {result['threads']} torch thr on cores {result['cores']}"
    else:
        row |= summarize(*history_steps(out, ctx["completions"]), args.warmup, callback_wall=False)
        found = re.search(r"torch uses (\d+) CPU thread", log.read_text())
        threads = found.group(1) if found else "?"
        row["threads"] = f"trainer {threads} torch thr on cores {sampler.cores.get('trainer')}; "
        row["threads"] += f"server on cores {sampler.cores.get('server')}"
    return row


HEAD = (
    f"{'arm':<12} {'s/step':>6} {'steps/s':>7} {'rt s/st':>7} {'gen':>6} {'sync':>5} {'reward':>6} {'score':>5} "
    f"{'train':>6} {'server':>6} {'tok/st':>6} {'tok/s':>6} {'trainMB':>7} {'workMB':>6} {'servMB':>6}  load avg"
)


def row_text(r: dict) -> str:
    if r.get("failed"):
        return f"{r['arm']:<12} FAILED: see {r['log']}"
    phases = (
        f"{r['generate']:>6.2f} {r['weight_sync']:>5.2f} {r['reward']:>6.2f} {r['score']:>5.2f} {r['train']:>6.2f}"
    )
    memory = f"{r['trainer_rss'] / MIB:>7.0f} {r['workers_rss'] / MIB:>6.0f} {r['server_rss'] / MIB:>6.0f}"
    return (
        f"{r['arm']:<12} {r['wall']:>6.2f} {1 / r['wall']:>7.3f} {r['rt_wall']:>7.2f} {phases} {r['server']:>6.2f} "
        f"{r['tokens']:>6.0f} {r['tok_s']:>6.1f} {memory}  {r['load']}"
    )


def report(rows: list[dict], args, ctx: dict) -> None:
    print(f"\n{HEAD}\n" + "\n".join(row_text(r) for r in rows))
    done = {r["arm"]: r for r in rows if not r.get("failed")}
    for base, ours in (("stock", "hf_grpo"), ("stock_tuned", "hf_grpo"), ("stock_tuned", "hf_grpo_plain")):
        if base in done and ours in done:
            print(f"\n{compare(done[base], done[ours])}")
    limited = [limits.describe(r) for r in rows if "train_limit" in r]
    if limited:
        print("\nlimits (benchmarks/limits.py, measured in each arm's process before its model loaded):")
        print("\n".join(f"  {line}" for line in limited))
    if "vllm_sync" in done and "vllm_overlap" in done:
        sync, over = done["vllm_sync"], done["vllm_overlap"]
        gen, train = sync["generate"], sync["wall"] - sync["generate"]
        ideal = (gen + train) / max(gen, train)
        print(
            f"\noverlap: sync {1 / sync['wall']:.3f} steps/s, overlapped {1 / over['wall']:.3f} steps/s, ratio "
            f"{sync['wall'] / over['wall']:.2f}x; ideal (G+T)/max(G,T) = ({gen:.2f} + {train:.2f}) / "
            f"{max(gen, train):.2f} = {ideal:.2f}x (G = sync gen, T = sync s/step - G)"
        )
    seed, save = ctx["recipe"].training.seed, ctx["recipe"].training.save_strategy
    save = getattr(save, "value", save)
    print(
        f"\nhow it was measured: recipe {args.recipe}, seed {seed}, {args.steps} steps per arm, the first "
        f"{args.warmup} left out of every mean, {ctx['completions']} completions per optimizer step, save_strategy "
        f"{save}; every arm: {' '.join(ctx['common'])} {' '.join(ctx['extra'])}"
    )
    for r in rows:
        print(f"  {r['arm']}: {r.get('threads', '?')}; load average before {r['load']}\n    {r['command']}")
        if r.get("differ"):
            print(f"    GRPOConfig fields that differ from the recipe's: {r['differ']}")
    print(__doc__[__doc__.index("- Every arm") :].replace("``", "").rstrip())


def compare(base: dict, ours: dict) -> str:
    """``ours`` against ``base``: the steps/s ratio and the difference by phase."""
    extra, rt = ours["wall"] - base["wall"], ours["rt_wall"] - base["rt_wall"]
    phases = ", ".join(f"{k} {ours[k] - base[k]:+.2f}" for k in ("generate", "reward", "score", "train"))
    # arms that draw other random numbers sample other completions, so their steps hold other numbers of tokens
    per_token = (base["wall"] / base["tokens"]) / (ours["wall"] / ours["tokens"])
    return (
        f"{ours['arm']} over {base['arm']}: {base['wall'] / ours['wall']:.2f}x the steps/s; {extra:+.3f} s/step "
        f"({extra / base['wall']:+.1%}) by the step callback, {rt:+.3f} s/step ({rt / base['rt_wall']:+.1%}) by "
        f"train_runtime; by phase (s): {phases}; {per_token:.2f}x per completion token "
        f"({ours['tokens']:.0f} tokens a step against {base['tokens']:.0f})"
    )


def vllm_python(args) -> tuple[str | None, str]:
    """(Python with vLLM's CPU build, or None; what was found)."""
    python = args.vllm_python or sys.executable
    probe = "from hf_grpo.generation.vllm_install import find_vllm as f; v = f(); print(v.runs_on_cpu, v.describe())"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    ok, _, text = done.stdout.strip().partition(" ")
    return (python if ok == "True" else None), (text or done.stderr.strip()[-300:])


def main() -> None:
    args = parse_args()
    if args.child:
        return child_main(args.child)
    from hf_grpo.recipe import load_recipe

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; choose from {ARMS}")
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} leaves no step after the {args.warmup} warm-up steps")
    recipe_path = Path(args.recipe)  # the arms run in the repository root
    args.recipe = str(recipe_path.resolve() if recipe_path.is_file() else REPO / recipe_path)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="real-model-speed-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    common = ["--dynamic_sampling", "false", "--eval_before_after", "false", "--task_eval_steps", "0"]
    extra = shlex.split(args.run_args)
    recipe, _ = load_recipe([args.recipe, *common, *IN_PROCESS, *extra], for_run=False)
    completions = recipe.plan.completions_per_optimizer_step
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    ctx = dict(workdir=workdir, common=common, extra=extra, recipe=recipe, completions=completions, env=env)
    if any(a.startswith("vllm") for a in arms):
        ctx["vllm_python"], found = vllm_python(args)
        print(f"vLLM for the vllm arms ({args.vllm_python or sys.executable}): {found}", flush=True)
        if ctx["vllm_python"] is None:
            print("skipping vllm_sync and vllm_overlap: no vLLM CPU build there (give one with --vllm-python)")
            arms = [a for a in arms if not a.startswith("vllm")]
    print(f"workdir {workdir}\n{HEAD}", flush=True)
    rows = []
    for arm in arms:
        rows.append(run_arm(arm, ctx, args))
        print(row_text(rows[-1]), flush=True)
    (workdir / "real_model_speed.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    report(rows, args, ctx)
    print(f"\ntable as JSON: {workdir / 'real_model_speed.json'}")


if __name__ == "__main__":
    main()
