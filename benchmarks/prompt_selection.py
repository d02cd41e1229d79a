"""Prompt selection (``prompt_selection: true``) vs dynamic sampling as it was vs stock TRL, on the embedded task.

    python benchmarks/prompt_selection.py                          # 3 seeds x 5 arms, ~40 min on 2 CPU cores
    python benchmarks/prompt_selection.py --seeds 0 --budget 60    # a quick look
    python benchmarks/prompt_selection.py --side-by-side            # 15 processes at 1 thread: for 16+ cores
    python benchmarks/prompt_selection.py --summarize OUT/rows/*.json  # the table again from a run's rows

The settings are recipes/tiny.yaml's (the default run): the tiny model warm-started 300 steps, 4,000 training
problems, 256 completions a step (128 prompts x 2), LoRA r16, temperature 0.7, dapo loss, max_generation_batches 16.
Arms, each from the same warm-started model and seed:

- ``stock@LR``: ``trl.GRPOTrainer`` at each of ``--stock-lrs`` (the table reports each; the verdict uses the best);
- ``ds``: ``hf_grpo.GRPOTrainer`` with dynamic sampling, as before prompt selection;
- ``ds+sel``: the same with ``prompt_selection: true``.

Each arm trains until ``--budget`` seconds of training (evaluation paused); every ``--eval-every`` steps greedy
accuracy on the ``--eval-size`` held-out problems is measured. The target is fixed before any arm runs: the
warm-started model's accuracy plus ``--target-gain``, reached when the mean of the last ``--smooth`` evaluations
gets there. Per arm and seed: training seconds and generated completions until the target, accuracy at the budget
(equal training time) with its paired 95% interval against the start (``hf_grpo.evaluation.stats.paired_gain``,
the same problems graded before and after), and generated completions per trained one. Completions are counted
where TRL generates them (``_generate``), for every arm the same way.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import trl
from dynamic_sampling import Clock  # benchmarks/dynamic_sampling.py: training time with evaluation paused
from peft import LoraConfig

from hf_grpo.config import HfGRPOConfig
from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.evaluation.core import evaluate
from hf_grpo.evaluation.stats import paired_gain
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.rewards.functions import gsm8k_correctness
from hf_grpo.training.trainer import GRPOTrainer
from hf_grpo.training.warm_start import warm_start


def make_trainer(arm, lr, model, tokenizer, train, out: str, seed: int, generations: int = 2, target: float = 0.75):
    common = dict(
        output_dir=out,
        per_device_train_batch_size=256,
        num_generations=generations,
        max_completion_length=16,
        temperature=0.7,
        learning_rate=lr,
        lr_scheduler_type="constant",
        max_steps=100_000,
        logging_steps=10_000,  # no log lines: what the table needs is counted here
        report_to=[],
        save_strategy="no",
        seed=seed,
        gradient_checkpointing=False,
        disable_tqdm=True,
        bf16=False,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
    )
    peft = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    if arm == "stock":
        args = trl.GRPOConfig(**common)
        cls = trl.GRPOTrainer
    else:
        args = HfGRPOConfig(
            **common,
            dynamic_sampling=True,
            max_generation_batches=16,
            prompt_selection=arm == "ds+sel",
            prompt_selection_target=target,
        )
        cls = GRPOTrainer
    trainer = cls(
        model=copy.deepcopy(model),
        reward_funcs=gsm8k_correctness,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=peft,
    )
    trainer.generated = 0
    generate = trainer._generate

    def counting(prompts):  # every completion any arm generates passes here (TRL's _generate)
        trainer.generated += len(prompts)
        return generate(prompts)

    trainer._generate = counting
    return trainer


def run_arm(arm, lr, seed, setup, args) -> dict:
    model, tokenizer, train, grade, start_grades, target = setup
    out = f"{args.out}/{arm}-{lr}-{seed}"
    trainer = make_trainer(arm, lr, model, tokenizer, train, out, seed, args.generations, args.selection_target)
    counts: list[int] = []

    def accuracy(m) -> float:
        counts.append(trainer.generated)
        return sum(g == "correct" for g in grade(m)) / len(start_grades)

    clock = Clock(args.budget, args.eval_every, accuracy)
    trainer.add_callback(clock)
    trainer.train()
    accs = [a for *_, a in clock.curve]
    smooth = [statistics.mean(accs[max(0, i - args.smooth + 1) : i + 1]) for i in range(len(accs))]
    hit = next((i for i, a in enumerate(smooth) if a >= target), None)
    grades = grade(trainer.model)
    final = paired_gain(start_grades, grades)
    trained = trainer.state.global_step * 256
    return {
        "arm": arm if arm != "stock" else f"stock@{lr:g}",
        "seed": seed,
        "steps": trainer.state.global_step,
        "seconds_to_target": clock.curve[hit][1] if hit is not None else None,
        "generated_to_target": counts[hit] if hit is not None else None,
        "final": final,
        "grades": grades,
        "generated_per_trained": trainer.generated / trained if trained else float("nan"),
    }


ORDER = ("stock", "ds", "ds+sel")  # table order of the arms
HEADER = (
    f"{'seed':>4s}  {'arm':<12s} {'steps':>5s} {'gen/trn':>8s}  {'to target: s, generated':>18s}  acc@budget  gain"
)


def fmt(row: dict) -> str:
    f = row["final"]
    reach = (
        f"{row['seconds_to_target']:7.0f} s {row['generated_to_target']:>8d}"
        if row["seconds_to_target"] is not None
        else f"{'not reached':>18s}"
    )
    return (
        f"{row['seed']:>4d}  {row['arm']:<12s} {row['steps']:>5d} {row['generated_per_trained']:>8.2f}  {reach}  "
        f"{f['after_accuracy']:.3f}  {f['gain']:+.3f} [{f['ci95'][0]:+.3f}, {f['ci95'][1]:+.3f}]"
    )


def arm_list(args) -> list[tuple[str, float]]:
    """The arms to run, in table order: (``stock``, lr) for each stock rate, then (``ds``, lr) and (``ds+sel``, lr)."""
    every = [("stock", lr) for lr in args.stock_lrs] + [("ds", args.lr), ("ds+sel", args.lr)]
    names = {f"stock@{lr:g}" if arm == "stock" else arm: (arm, lr) for arm, lr in every}
    unknown = sorted(set(args.arms or []) - set(names))
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; choose from {sorted(names)}")
    return [pair for name, pair in names.items() if not args.arms or name in args.arms]


def side_by_side(args) -> list[str]:
    """Run every (seed, arm) in its own process at 1 thread, all at once (for a machine with that many cores).

    Each process writes its row to ``OUT/rows`` and its output to ``OUT/log-SEED-ARM.txt``; returns the row files.
    Every process warm-starts the same model (same seed, same thread count), so all share one start and target.
    """
    shared = ["--budget", str(args.budget), "--lr", str(args.lr), "--target-gain", str(args.target_gain)]
    shared += ["--smooth", str(args.smooth), "--eval-every", str(args.eval_every), "--eval-size", str(args.eval_size)]
    shared += ["--generations", str(args.generations), "--train-size", str(args.train_size)]
    shared += ["--selection-target", str(args.selection_target), "--out", args.out, "--threads", "1"]
    shared += ["--stock-lrs", *map(str, args.stock_lrs)]
    rows_dir = Path(args.out) / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    names = [f"stock@{lr:g}" if arm == "stock" else arm for arm, lr in arm_list(args)]
    jobs = []
    for seed in args.seeds:
        for i, name in enumerate(names):
            rows = rows_dir / f"{seed}-{i}.json"
            rows.unlink(missing_ok=True)
            log = open(Path(args.out) / f"log-{seed}-{i}.txt", "w")  # noqa: SIM115 (closed when the process ends)
            argv = [sys.executable, __file__, *shared, "--seeds", str(seed), "--arms", name, "--rows-out", str(rows)]
            jobs.append((rows, log, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)))
    print(f"{len(jobs)} processes ({len(args.seeds)} seeds x {names}), logs in {args.out}", flush=True)
    failed = []
    for rows, log, process in jobs:
        if process.wait() != 0 or not rows.exists():
            failed.append(f"{log.name} (exit {process.returncode})")
        log.close()
    if failed:
        raise SystemExit(f"side by side: {len(failed)} runs failed, see " + ", ".join(failed))
    return [str(rows) for rows, _, _ in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=float, default=120.0, help="training seconds per arm (evaluation paused)")
    parser.add_argument("--stock-lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3])
    parser.add_argument("--lr", type=float, default=2e-3, help="the dynamic-sampling arms' (recipes/tiny.yaml)")
    parser.add_argument("--target-gain", type=float, default=0.10, help="target = start accuracy + this")
    parser.add_argument("--smooth", type=int, default=2, help="evaluations averaged for the target")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--generations", type=int, default=2, help="num_generations (recipes/tiny.yaml: 2)")
    parser.add_argument(
        "--selection-target", type=float, default=0.75, help="the ds+sel arm's prompt_selection_target"
    )
    parser.add_argument(
        "--train-size", type=int, default=4000, help="training problems (recipes/tiny.yaml: 4000; fewer: more epochs)"
    )
    parser.add_argument("--out", default="/tmp/hf_grpo_bench_selection")
    parser.add_argument("--arms", nargs="+", help="only these arms (stock@LR, ds, ds+sel); default every arm")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all CPUs)")
    parser.add_argument("--rows-out", help="also write this process's rows (grades included) to this JSON file")
    parser.add_argument("--summarize", nargs="+", metavar="ROWS", help="only print the table from --rows-out files")
    parser.add_argument(
        "--side-by-side", action="store_true", help="one process per seed and arm at 1 thread each, all at once"
    )
    args = parser.parse_args()
    if args.side_by_side:
        args.summarize = side_by_side(args)
    if args.summarize:
        rows = [row for path in args.summarize for row in json.loads(Path(path).read_text())]
        rows.sort(key=lambda r: (r["seed"], r["order"]))
        print(f"\n{HEADER}")
        for row in rows:
            print(fmt(row))
        summarize(rows, sorted({r["seed"] for r in rows}))
        return

    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, 300, lr=2e-3)
    train, held_out = load_grpo_datasets(
        DataArguments(arithmetic_train_size=args.train_size, arithmetic_eval_size=args.eval_size)
    )

    def grade(m) -> list[str]:
        result = evaluate(m, tokenizer, held_out, "gsm8k", max_new_tokens=16)
        return [r["grade"] for r in result.records]

    start_grades = grade(model)
    start = sum(g == "correct" for g in start_grades) / len(start_grades)
    target = start + args.target_gain
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, trl {trl.__version__}; held-out "
        f"{len(held_out)} problems, greedy; {len(train)} training problems, {args.threads} threads; start accuracy {start:.3f}; target (fixed now) {target:.3f} "
        f"(mean of the last {args.smooth} evaluations); budget {args.budget:.0f} training s per arm",
        flush=True,
    )
    setup = (model, tokenizer, train, grade, start_grades, target)
    arms = arm_list(args)
    rows = []
    print(f"\n{HEADER}")
    for seed in args.seeds:
        for arm, lr in arms:
            rows.append({**run_arm(arm, lr, seed, setup, args), "order": ORDER.index(arm) + lr})
            print(fmt(rows[-1]), flush=True)
            if args.rows_out:
                with open(args.rows_out, "w") as f:
                    json.dump(rows, f)
    if {arm for arm, _ in arms} == set(ORDER):
        summarize(rows, args.seeds)


def summarize(rows: list[dict], seeds: list[int]) -> None:
    """Per seed: the best stock arm (earliest to the target, else highest at the budget) against ds and ds+sel."""
    print()
    for seed in seeds:
        mine = [r for r in rows if r["seed"] == seed]
        stock = [r for r in mine if r["arm"].startswith("stock")]
        best = min(
            stock,
            key=lambda r: (r["seconds_to_target"] is None, r["seconds_to_target"] or -r["final"]["after_accuracy"]),
        )
        ds, sel = (next(r for r in mine if r["arm"] == a) for a in ("ds", "ds+sel"))

        def ratio(a, b):
            ta, tb = a["seconds_to_target"], b["seconds_to_target"]
            return f"{ta / tb:.2f}x" if ta and tb else "n/a (a target not reached)"

        between = paired_gain(ds["grades"], sel["grades"])  # the same problems, at the same training time
        low = ds["final"]["ci95"][0]
        where = "inside or above" if sel["final"]["gain"] >= low else "BELOW"
        print(
            f"seed {seed}: time to target ds / ds+sel = {ratio(ds, sel)}; {best['arm']} / ds+sel = {ratio(best, sel)}; "
            f"generated per trained ds {ds['generated_per_trained']:.2f}, ds+sel {sel['generated_per_trained']:.2f}; "
            f"gain at the budget ds+sel {sel['final']['gain']:+.3f}, {where} ds's interval [{low:+.3f}, "
            f"{ds['final']['ci95'][1]:+.3f}]; ds+sel - ds {between['gain']:+.3f} [{between['ci95'][0]:+.3f}, "
            f"{between['ci95'][1]:+.3f}]"
        )


if __name__ == "__main__":
    main()
