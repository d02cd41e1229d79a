"""Does overlapped generation learn as well as synchronous generation? The default task in a server layout, 3 seeds.

    python benchmarks/overlap_learning.py                    # seeds 0 1 2, sync and overlap each (~15 min on 2 cores)
    python benchmarks/overlap_learning.py --seeds 0 --max-steps 10   # a quick look
    python benchmarks/overlap_learning.py --reuse --out DIR          # the table again from the runs in DIR
    python benchmarks/overlap_learning.py --seeds 0 --run-args '--generation.seed 100'   # other sampling noise

What runs, and how (the output says it again next to the numbers):

- The default recipe (``recipes/tiny.yaml``: the arithmetic task, the embedded tiny model warm-started 300 steps,
  LoRA r16, dynamic sampling, 40 steps) with ``generation.backend: vllm_server`` and ``generation.base_url`` of a
  server this script starts: the CPU stand-in for ``vllm serve`` (``python -m hf_grpo.vllm_standin``, hf_grpo's
  sampling engine behind vLLM's HTTP API), because real vLLM's CPU attention refuses the tiny model's head_dim 16.
  The server loads the same warm-started weights the trainer starts from: per seed, the policy is built exactly as
  the recipe's ``model_name_or_path: tiny`` builds it (``build_tokenizer(seed)``, ``build_model(seed, 64)``,
  ``warm_start(300 steps, lr 2e-3, seed)``), saved once, and both runs of that seed load it
  (``--model_name_or_path DIR --warm_start_steps 0``).
- Per seed two runs, each with a fresh server: ``sync`` (every step waits for its generation) and ``overlap``
  (``--generation.overlap true``: the server generates step t+1 while step t trains, max_staleness 1); the order
  alternates with the seed. Everything else is the recipe's, the seed included (``--seed N``).
- Held-out accuracy: the recipe's greedy evaluation before and after training on its 500 held-out problems, graded
  per problem (``eval_before.jsonl`` / ``eval_after.jsonl``). ``gain`` = after - before with its paired 95%
  interval (``hf_grpo.evaluation.stats.gain_from_run``, Bonett-Price). Both runs of a seed share the problems and
  the before-accuracy (same starting weights).
- The issue's bar, per seed: the overlapped gain is >= 0.20, and it lies inside the synchronous run's paired 95%
  interval (``in sync CI``). Also shown: ``overlap - sync``, the difference of the two after-accuracies on the same
  problems with its paired 95% interval (``paired_gain(sync after, overlap after)``).
- Staleness: from each overlapped run's ``training_history.json``, the trained groups per lag (``async/staleness_<k>``
  summed over the steps; the runs log every step, ``--logging_steps 1``, which changes nothing else).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from hf_grpo.base.run_files import EVAL_RECORDS
from hf_grpo.evaluation.stats import gain_from_run, paired_gain


REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny.yaml"
GAIN_BAR = 0.20


def build_policy(seed: int, recipe: dict, out: Path) -> Path:
    """The recipe's warm-started tiny policy for ``seed``, saved to ``out`` (as hf_grpo.run.pipeline.load_policy)."""
    from hf_grpo.models.tiny import build_model, build_tokenizer  # torch: after argument parsing
    from hf_grpo.training.warm_start import warm_start

    if (out / "config.json").is_file():
        return out
    tokenizer = build_tokenizer(seed=seed)
    model = build_model(tokenizer, seed=seed, hidden_size=recipe["tiny_hidden_size"])
    warm_start(model, tokenizer, recipe["warm_start_steps"], lr=recipe["warm_start_lr"], seed=seed, progress=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(policy: Path, seed: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "hf_grpo.vllm_standin", str(policy), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--seed", str(seed), "--logprobs-mode", "processed_logprobs", "--dtype", "float32"]
    argv += ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "3"]
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    import requests  # after the server started: its start-up overlaps this import

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the stand-in server exited with {process.returncode}; its log: {log}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"the stand-in server did not become healthy in 300 s; its log: {log}")


def reused(mode: str, seed: int, out: Path) -> dict | None:
    """A finished run already in ``out`` (``--reuse``): its measurements, with the wall time its row file kept."""
    if not (out / "eval_after.jsonl").is_file():
        return None
    saved = out.parent / f"seed{seed}-{mode}.json"
    seconds = json.loads(saved.read_text())["seconds"] if saved.is_file() else float("nan")
    row = {"seed": seed, "mode": mode, "seconds": seconds, "returncode": 0, "dir": str(out), "reused": True}
    return {**row, **gain_from_run(out), "staleness": staleness_counts(out)}


def run_one(
    mode: str, seed: int, policy: Path, root: Path, max_steps: int | None, extra: list[str], both: list[str]
) -> dict:
    out = root / f"seed{seed}-{mode}"
    server, url = start_server(policy, seed, root / f"seed{seed}-{mode}-server.log")
    argv = [sys.executable, "-m", "hf_grpo.train", str(RECIPE), "--seed", str(seed), "--output_dir", str(out)]
    argv += ["--model_name_or_path", str(policy), "--warm_start_steps", "0", "--disable_tqdm", "true"]
    argv += ["--logging_steps", "1"]  # every step's own record: the staleness counts below are exact
    argv += ["--generation.backend", "vllm_server", "--generation.base_url", url, *both]
    if mode == "overlap":
        argv += ["--generation.overlap", "true", *extra]
    if max_steps is not None:
        argv += ["--max_steps", str(max_steps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    try:
        with (root / f"seed{seed}-{mode}.log").open("w") as log:
            code = subprocess.run(
                argv, check=False, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            ).returncode
    finally:
        server.terminate()
        server.wait(timeout=60)
    row = {"seed": seed, "mode": mode, "seconds": time.perf_counter() - start, "returncode": code, "dir": str(out)}
    if code == 0:
        row.update(gain_from_run(out))
        row["staleness"] = staleness_counts(out)
        (root / f"seed{seed}-{mode}.json").write_text(json.dumps({"seconds": row["seconds"], "argv": argv}))
    return row


def staleness_counts(out: Path) -> dict[int, float]:
    """Trained groups per lag k over the run, from the ``async/staleness_<k>`` metrics (empty for a sync run)."""
    history = json.loads((out / "training_history.json").read_text())
    counts: dict[int, float] = {}
    for record in history:
        for key, value in record.items():
            if key.startswith("async/staleness_") and key[len("async/staleness_") :].isdigit():
                k = int(key[len("async/staleness_") :])
                counts[k] = counts.get(k, 0.0) + value
    return counts


def after_grades(out: Path) -> dict[int, str]:
    lines = (out / EVAL_RECORDS.format(label="after")).read_text().splitlines()
    return {(r := json.loads(line))["index"]: r["grade"] for line in lines if line.strip()}


def compare(sync: dict, overlap: dict) -> dict:
    a, b = after_grades(Path(sync["dir"])), after_grades(Path(overlap["dir"]))
    order = sorted(a)
    return paired_gain([a[i] for i in order], [b[i] for i in order])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--out", default="/tmp/hf_grpo_bench_overlap_learning")
    parser.add_argument("--modes", nargs="+", choices=["sync", "overlap"], default=["sync", "overlap"])
    parser.add_argument(
        "--reuse", action="store_true", help="take a finished run found in --out instead of running it again"
    )
    parser.add_argument(
        "--overlap-args", default="", help="more recipe keys for the overlapped runs, e.g. '--beta 0.01'"
    )
    parser.add_argument(
        "--run-args",
        default="",
        help="more recipe keys for every run, e.g. '--generation.seed 100' (other sampling noise, same data and init)",
    )
    args = parser.parse_args()
    recipe = yaml.safe_load(RECIPE.read_text())
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()}; recipe {RECIPE.name}, server: the CPU stand-in (see docstring)")
    if args.run_args or args.overlap_args:
        print(f"every run: {args.run_args or '(recipe only)'}; overlapped runs also: {args.overlap_args or '-'}")
    rows = []
    for seed in args.seeds:
        policy = build_policy(seed, recipe, root / f"policy-seed{seed}")
        modes = ["sync", "overlap"] if seed % 2 == 0 else ["overlap", "sync"]
        modes = [m for m in modes if m in args.modes]
        runs = {}
        for mode in modes:
            found = reused(mode, seed, root / f"seed{seed}-{mode}") if args.reuse else None
            extra = args.overlap_args.split()
            runs[mode] = found or run_one(mode, seed, policy, root, args.max_steps, extra, args.run_args.split())
        rows.append(runs)
        for mode in modes:
            r = runs[mode]
            if "gain" not in r:
                print(f"seed {seed} {mode}: FAILED (exit {r['returncode']}), log {root}/seed{seed}-{mode}.log")
            else:
                low, high = r["ci95"]
                print(
                    f"seed {seed} {mode:<7} before {r['before_accuracy']:.3f} after {r['after_accuracy']:.3f} "
                    f"gain {r['gain']:+.3f} [{low:+.3f}, {high:+.3f}]  {r['seconds']:.0f} s"
                    + (f"  (reused: {r['dir']})" if r.get("reused") else ""),
                    flush=True,
                )
    if all(len(runs) == 2 for runs in rows):
        print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    lines = [
        "",
        (
            "seed  sync gain [95% interval]     overlap gain  >=0.20  in sync CI  overlap-sync after [95% interval]  "
            "staleness (groups at lag 0/1/2)  sync s  overlap s"
        ),
    ]
    gained = inside_count = 0
    for runs in rows:
        sync, overlap = runs["sync"], runs["overlap"]
        if "gain" not in sync or "gain" not in overlap:
            lines.append(f"{sync['seed']:>4}  FAILED")
            continue
        low, high = sync["ci95"]
        inside = low <= overlap["gain"] <= high
        gained += overlap["gain"] >= GAIN_BAR
        inside_count += inside
        diff = compare(sync, overlap)
        stale = "/".join(f"{overlap['staleness'].get(k, 0):.0f}" for k in range(3))
        lines.append(
            f"{sync['seed']:>4}  {sync['gain']:+.3f} [{low:+.3f}, {high:+.3f}]     {overlap['gain']:+.3f}        "
            f"{'yes' if overlap['gain'] >= GAIN_BAR else 'NO':<6}  {'yes' if inside else 'NO':<10}  "
            f"{diff['gain']:+.3f} [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]              {stale:<31}  "
            f"{sync['seconds']:6.0f}  {overlap['seconds']:9.0f}"
        )
    lines.append(
        f"overlap gain >= {GAIN_BAR}: {gained} of {len(rows)} seeds (the issue asks all); inside the sync run's paired "
        f"95% interval: {inside_count} of {len(rows)} (the issue asks >= 2 of 3)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
