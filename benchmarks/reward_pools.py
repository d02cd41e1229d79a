"""The worker-pool comparison of ``benchmarks/rewards.py`` (``--pool``): hf_grpo's ``RewardPool`` vs pebble's ``ProcessPool``.

Issue 10, item 6: could ``hf_grpo/base/workers.py`` be replaced by pebble? The same work on ``RewardPool`` and on
``benchmarks/pebble_pool.py``'s ``PebblePool`` (as it comes, and with an initializer that adds our worker hardening):
cold and warm start-up, throughput, kill and replacement latency, a worker dying while idle, and what outlives a
SIGKILLed parent. ``compare_pools`` prints the method above its tables. Run it through the script:

    python benchmarks/rewards.py --pool both          # about 1 minute on 2 cores

The cold start runs ``benchmarks/rewards.py --_child KIND`` in a fresh interpreter, which calls ``pool_child``.
Everything heavy is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reward_completions import PATHOLOGICAL, build


# the script whose --_child runs pool_child in a fresh interpreter
SCRIPT = Path(__file__).resolve().with_name("rewards.py")

POOL_CHOICES = {
    "ours": ["ours"],
    "pebble": ["pebble", "pebble+init"],
    "both": ["ours", "pebble", "pebble+init"],
    "none": [],
}
POOL_LABELS = {
    "ours": "hf_grpo RewardPool",
    "pebble": "pebble (stock)",
    "pebble+init": "pebble + our init",
}
FIRST_ITEM = {"completion": r"so $\boxed{\frac{1}{2}}$", "gold": r"\boxed{0.5}"}  # one MATH grade
ORPHAN_WAIT_S = 3.0  # after the parent's SIGKILL, how long its workers get to go away
POOL_TIMEOUT_S = 10.0  # the per-completion timeout of the throughput runs (recipes' default reward_timeout)


def make_pool(kind: str, workers: int):
    if kind == "ours":
        from hf_grpo.rewards.wrapper import RewardPool

        return RewardPool(workers)
    from pebble_pool import PebblePool

    return PebblePool(workers, init="hardened" if kind == "pebble+init" else "stock")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pool_child(kind: str, workers: int) -> None:
    """In a fresh interpreter (``--_child``): cold start-up, then one worker stuck in C code, then wait to be killed.

    Prints one JSON line: start-up seconds, the worker pids, the fork server's and resource tracker's pids, and
    whether the stuck worker was seen running.
    """
    import functools
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    import threading

    import psutil
    from pebble_pool import c_loop_forever, graded_by

    if kind != "ours":
        import pebble  # noqa: F401 - imports are not start-up: RewardPool's are done above by pebble_pool

    start = time.perf_counter()
    pool = make_pool(kind, workers)
    (first,) = pool.map(functools.partial(graded_by, "math"), [FIRST_ITEM], timeout=120.0)
    startup = time.perf_counter() - start
    threading.Thread(target=pool.map, args=(c_loop_forever, [{}], 3600.0), daemon=True).start()
    running = False
    end = time.monotonic() + 5.0
    while not running and time.monotonic() < end:  # until a worker is on the CPU (in the C loop)
        time.sleep(0.1)
        running = any(psutil.Process(pid).status() == psutil.STATUS_RUNNING for pid in pool.worker_pids if _alive(pid))
    helpers = [
        multiprocessing.forkserver._forkserver._forkserver_pid,
        multiprocessing.resource_tracker._resource_tracker._pid,
    ]
    info = {
        "startup_s": startup,
        "first_ok": first.ok,
        "workers": pool.worker_pids,
        "helpers": helpers,
        "stuck": running,
    }
    print(json.dumps(info), flush=True)
    time.sleep(3600)


def cold_start_and_orphans(kind: str, workers: int) -> dict:
    """Run ``pool_child`` in a fresh interpreter, SIGKILL it once its worker is stuck, count what outlives it."""
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--_child", kind, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    import select

    line = ""
    if select.select([child.stdout], [], [], 180.0)[0]:
        line = child.stdout.readline()
    child.kill()  # SIGKILL: no atexit, no finalizers, no pool.close()
    child.wait()
    killed = time.monotonic()
    if not line:
        return {"error": (child.stderr.read().strip().splitlines() or ["no output"])[-1]}
    info = json.loads(line)
    watched = info["workers"] + info["helpers"]
    while time.monotonic() - killed < ORPHAN_WAIT_S and any(_alive(pid) for pid in watched):
        time.sleep(0.05)
    gone_after = time.monotonic() - killed
    info["workers_left"] = [pid for pid in info["workers"] if _alive(pid)]
    info["helpers_left"] = [pid for pid in info["helpers"] if _alive(pid)]
    info["gone_after_s"] = gone_after
    for pid in info["workers_left"] + info["helpers_left"]:  # processes this benchmark started: clean up
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return info


def kill_and_replace(pool, hangs: dict, timeout: float) -> dict:
    """On a 1-worker pool: per hang, kill latency (past ``timeout``) and replacement latency (kill to next result)."""
    import functools

    from pebble_pool import graded_by

    fn = functools.partial(graded_by, "math")
    (warm,) = pool.map(fn, [FIRST_ITEM], timeout=120.0)
    pid = warm.value[0]
    out = {}
    for name, (hang_fn, hang_item) in hangs.items():
        start = time.perf_counter()
        (hung,) = pool.map(hang_fn, [hang_item], timeout=timeout)
        kill = time.perf_counter() - start - timeout
        start = time.perf_counter()
        (after,) = pool.map(fn, [FIRST_ITEM], timeout=120.0)
        replace = time.perf_counter() - start
        new_pid = after.value[0] if after.ok else None
        out[name] = {
            "status": hung.status,
            "kill_s": kill,
            "replace_s": replace,
            "new_worker": new_pid not in (None, pid),
        }
        pid = new_pid
    # a worker that dies while idle, between two calls (the OOM killer, a segfault in a C extension's thread)
    os.kill(pool.worker_pids[0], signal.SIGKILL)
    time.sleep(0.5)
    try:
        (after,) = pool.map(fn, [FIRST_ITEM], timeout=120.0)
        out["idle death"] = after.status
    except Exception as exc:  # noqa: BLE001 - reported
        out["idle death"] = f"raises {type(exc).__name__}: {exc}"
    return out


def compare_pools(args: argparse.Namespace) -> None:
    """hf_grpo's RewardPool vs pebble's ProcessPool: start-up, throughput, kill and replacement, parent SIGKILL."""
    kinds = POOL_CHOICES[args.pool]
    halves, hangs = pool_work(args.pool_n)
    print_pools_method(args, kinds, halves)

    cold = {kind: cold_start_and_orphans(kind, args.workers) for kind in kinds}  # each pool in its own interpreter
    server_s = start_fork_server(uses_pebble(kinds))
    pools, warm, preloaded = start_warm(kinds, args.workers)
    outputs, times = time_throughput(pools, halves, args.pool_repeats)
    for pool in pools.values():
        pool.close()
    faults = {}
    for kind in kinds:
        pool = make_pool(kind, 1)
        faults[kind] = kill_and_replace(pool, hangs, args.kill_timeout)
        pool.close()

    print_throughput_table(args, kinds, server_s, cold, warm, outputs, times)
    print()
    print_faults_table(kinds, faults)
    print()
    print_orphans_table(kinds, cold, preloaded)


def uses_pebble(kinds: list[str]) -> bool:
    return any(k != "ours" for k in kinds)


def pool_work(n: int) -> tuple[dict, dict]:
    """The throughput work, {half: (fn, items)} over ``build(n)``, and the hangs, {name: (fn, item)}."""
    import functools

    from pebble_pool import c_loop_forever, graded_by

    from hf_grpo.rewards.functions import grade_completion

    data = build(n)
    halves = {
        "GSM8K": (functools.partial(grade_completion, "gsm8k"), data["gsm8k"]),
        "MATH": (functools.partial(grade_completion, "math"), data["math"]),
    }
    halves = {
        name: (fn, [{"completion": c, "gold": s} for c, s in zip(d["completions"], d["solution"], strict=True)])
        for name, (fn, d) in halves.items()
    }
    hangs = {
        "C loop": (c_loop_forever, {}),
        "never-ending factorial": (
            functools.partial(graded_by, "math"),
            {"completion": PATHOLOGICAL, "gold": r"\boxed{1}"},
        ),
    }
    return halves, hangs


def print_pools_method(args: argparse.Namespace, kinds: list[str], halves: dict) -> None:
    """The pools compared and how each number is measured, above the tables."""
    n_g, n_m = len(halves["GSM8K"][1]), len(halves["MATH"][1])
    T = args.kill_timeout
    if uses_pebble(kinds):
        import pebble

        version = f"pebble {pebble.__version__}"
    print(
        f"== pools: {', '.join(POOL_LABELS[k] for k in kinds)}"
        + (
            f" ({version}; 'stock' = initializer warm_up, '+ our init' = warm_up + _die_with_parent + SIGTERM SIG_DFL)"
            if uses_pebble(kinds)
            else ""
        )
    )
    print(
        "method (wall clock, time.perf_counter; every pool on a 'forkserver' context preloading hf_grpo.rewards, sympy,"
    )
    print("        latex2sympy2_extended, math_verify, and pebble for the pebble pools):")
    print("  start cold: a fresh interpreter (fork server not running), from creating the pool to the first result")
    print(f"              (one MATH grade), {args.workers} workers; includes starting the fork server and its preload")
    print(f"  start warm: the same in this process, fork server already running, {args.workers} workers")
    print(
        f"  throughput: {args.pool_n} completions ({n_g} GSM8K-style, {n_m} MATH-style, as --graders builds them) graded"
    )
    print(
        f"              by grade_completion through pool.map(fn, items, timeout={POOL_TIMEOUT_S:g}), one map per half as"
    )
    print(
        f"              IsolatedCorrectness calls it; {args.workers} workers; 'all' = both halves; best and median of"
    )
    print(f"              {args.pool_repeats} after 1 warm-up, the pools taking turns (order rotated each repeat)")
    print(f"  kill:       a 1-worker pool maps one hung item with timeout T = {T:g} s; latency = wall clock - T")
    print("              (hangs: 'C loop' = sum(range(10**13)), one C call that never lets a signal handler run;")
    print("              'never-ending factorial' = grade_completion('math', 99999999999! input))")
    print("  replace:    right after the kill, the same pool maps one MATH item: wall clock until its result, which")
    print("              must come from a new worker (pid checked); then that worker is SIGKILLed while idle and")
    print("              the pool maps one more item")
    print("  orphans:    the 'start cold' interpreter then puts one worker in the C loop and is SIGKILLed; workers")
    print(
        f"              and helpers (fork server, resource tracker) still alive {ORPHAN_WAIT_S:g} s later (then killed)"
    )
    print()


def start_fork_server(preload_pebble: bool) -> float:
    """This process's one fork server for every pool, started up front with the preload: seconds to its first child."""
    import multiprocessing
    import multiprocessing.forkserver

    from pebble_pool import PEBBLE_PRELOAD

    from hf_grpo.rewards.wrapper import PRELOAD

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PEBBLE_PRELOAD) if preload_pebble else list(PRELOAD))
    start = time.perf_counter()
    multiprocessing.forkserver.ensure_running()
    first_child = ctx.Process(target=time.sleep, args=(0,))  # served once the fork server has done its preload
    first_child.start()
    first_child.join()
    return time.perf_counter() - start


def start_warm(kinds: list[str], workers: int) -> tuple[dict, dict, dict]:
    """Each pool started in this process: (pools, seconds to the first result, whether its worker came preloaded)."""
    from pebble_pool import worker_info

    pools, warm, preloaded = {}, {}, {}
    for kind in kinds:
        start = time.perf_counter()
        pools[kind] = make_pool(kind, workers)
        (first,) = pools[kind].map(worker_info, [{}], timeout=120.0)
        warm[kind] = time.perf_counter() - start
        preloaded[kind] = first.value["preloaded"] if first.ok else None
    return pools, warm, preloaded


def time_throughput(pools: dict, halves: dict, repeats: int) -> tuple[dict, dict]:
    """A warm-up map per pool and half (the reference outputs), then ``repeats`` timed rounds, the pools taking turns.

    Returns (outputs, times): outputs[kind][half] the warm-up's results; times[kind] one dict per repeat with the
    seconds of each half and the parent's CPU seconds.
    """
    kinds = list(pools)
    outputs, times = {}, {kind: [] for kind in kinds}
    for kind in kinds:  # warm-up, and the reference outputs
        outputs[kind] = {half: pools[kind].map(fn, items, POOL_TIMEOUT_S) for half, (fn, items) in halves.items()}
    for rep in range(repeats):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for kind in order:
            per = {"cpu": 0.0}
            for half, (fn, items) in halves.items():
                start, cpu = time.perf_counter(), time.process_time()
                out = pools[kind].map(fn, items, POOL_TIMEOUT_S)
                per[half] = time.perf_counter() - start
                per["cpu"] += time.process_time() - cpu  # the parent's CPU, all its threads (pebble runs three)
                if out != outputs[kind][half]:
                    print(f"  note: {POOL_LABELS[kind]} gave different results on the {half} half in repeat {rep + 1}")
            times[kind].append(per)
    return outputs, times


def print_throughput_table(
    args: argparse.Namespace, kinds: list[str], server_s: float, cold: dict, warm: dict, outputs: dict, times: dict
) -> None:
    """Start-up and throughput per pool, its legend, and the 'all' seconds of every repeat."""
    import statistics

    reference = outputs[kinds[0]]
    print(f"this process: fork server start + preload + first child, before any 'start warm': {server_s:.2f} s")
    header = (
        f"{'pool':<20} {'start cold':>10} {'start warm':>10} {'GSM8K s':>8} {'MATH s':>7} {'all s':>6} "
        f"{'median':>6} {'compl/s':>7} {'vs ours':>7} {'median vs':>9} {'parent CPU':>10} {'not ok':>6} {'same':>4}"
    )
    print(header)
    best, median = {}, {}
    for kind in kinds:
        runs = times[kind]
        totals = [r["GSM8K"] + r["MATH"] for r in runs]
        best[kind], median[kind] = min(totals), statistics.median(totals)
        ratio = f"{best['ours'] / best[kind]:7.2f}" if "ours" in best else f"{'-':>7}"
        median_ratio = f"{median['ours'] / median[kind]:9.2f}" if "ours" in median else f"{'-':>9}"
        cpu = statistics.median(r["cpu"] for r in runs)
        statuses = [r.status for half in outputs[kind].values() for r in half]
        not_ok = sum(s != "ok" for s in statuses)
        same = outputs[kind] == reference
        c = cold[kind]
        cold_s = f"{c['startup_s']:10.2f}" if "startup_s" in c else f"{'failed':>10}"
        print(
            f"{POOL_LABELS[kind]:<20} {cold_s} {warm[kind]:10.2f} {min(r['GSM8K'] for r in runs):8.3f} "
            f"{min(r['MATH'] for r in runs):7.3f} {best[kind]:6.3f} {median[kind]:6.3f} "
            f"{args.pool_n / best[kind]:7.0f} {ratio} {median_ratio} {cpu:10.3f} {not_ok:>6} {'yes' if same else 'NO':>4}"
        )
    print(
        "  (start: s; GSM8K / MATH / all: best s for the half / both halves; median: of 'all'; compl/s: N / best 'all';"
    )
    print(
        "   vs ours / median vs: ours' seconds / this pool's, best and median, so 0.90 = 10% less throughput; parent"
    )
    print(
        "   CPU: the benchmark process's CPU seconds (all threads) per 'all', median; not ok: timeouts + errors in the"
    )
    print("   warm-up; same: the same grades as the first pool)")
    for kind in kinds:
        totals = " ".join(f"{r['GSM8K'] + r['MATH']:.3f}" for r in times[kind])
        print(f"  'all' s per repeat, {POOL_LABELS[kind]}: {totals}")


def print_faults_table(kinds: list[str], faults: dict) -> None:
    """Kill and replacement latency per pool and hang, then what a worker dying while idle did."""
    print(f"{'pool':<20} {'hang':<15} {'result':<8} {'kill s past T':>13} {'replace s':>9} {'new worker':>10}")
    for kind in kinds:
        for hang, f in faults[kind].items():
            if hang == "idle death":
                continue
            print(
                f"{POOL_LABELS[kind]:<20} {hang:<15} {f['status']:<8} {f['kill_s']:13.3f} {f['replace_s']:9.3f} "
                f"{'yes' if f['new_worker'] else 'NO':>10}"
            )
    print("then its worker is SIGKILLed while idle, and one more item is mapped:")
    for kind in kinds:
        print(f"  {POOL_LABELS[kind]:<20} {faults[kind]['idle death']}")


def print_orphans_table(kinds: list[str], cold: dict, preloaded: dict) -> None:
    """Per pool: what outlived the SIGKILLed cold-start interpreter, and whether its workers came preloaded."""
    print(f"{'pool':<20} {'hung worker':>11} {'workers left':>12} {'helpers left':>12} {'preloaded':>9}")
    for kind in kinds:
        c = cold[kind]
        if "error" in c:
            print(f"{POOL_LABELS[kind]:<20} child failed: {c['error']}")
            continue
        left = f"{len(c['workers_left'])} of {len(c['workers'])}"
        helpers = f"{len(c['helpers_left'])} of {len(c['helpers'])}"
        pre = {True: "yes", False: "NO", None: "n/a"}[preloaded[kind]]
        print(
            f"{POOL_LABELS[kind]:<20} {'running' if c['stuck'] else 'not seen':>11} {left:>12} {helpers:>12} {pre:>9}"
        )
    print(
        f"  (left: still alive {ORPHAN_WAIT_S:g} s after the parent's SIGKILL; preloaded: the PRELOAD modules were already"
    )
    print("   imported when the worker's initializer started, i.e. it came from the preloaded fork server; RewardPool")
    print("   workers import PRELOAD themselves before their initializer, so it cannot be seen from there: n/a)")
