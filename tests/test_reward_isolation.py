"""Fault-isolated rewards (``hf_grpo.rewards.wrapper`` on ``hf_grpo.base.workers``): hard timeouts, errors reported by name, warm workers.

Each test gets its own small pool (2 workers; the fork server stays up across tests, so a pool starts in well under
a second). Timeouts are short (``TIMEOUT``); what a call cost is read from its counters and started workers, and a
hanging call must return within ``TIMEOUT + SLACK`` seconds (not never; SLACK: room for a loaded machine).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time

import psutil
import pytest

from hf_grpo.rewards import RewardArguments, RewardLoadError, load_reward_funcs
from hf_grpo.rewards.functions import (
    gsm8k_correctness,
    hash_correctness,
    hash_format,
    length,
    math_correctness,
    r1_zero_correctness,
    r1_zero_format,
)
from hf_grpo.rewards.wrapper import (
    IsolatedCorrectness,
    IsolatedReward,
    RewardIsolationError,
    RewardPool,
    isolate,
)
from tests.helpers import reward_plugins
from tests.helpers.common import REPO


pytestmark = pytest.mark.timeout(120)

TIMEOUT = 2.0
LONG_TIMEOUT = 60.0  # for a call that must end before its timeout: ending at it would be a failure, not a delay
SLACK = 30.0  # a killed hang's replacement and the other items' grading, on a loaded machine
LOGGER = "hf_grpo.rewards.wrapper"

# A factorial math-verify computes for ever (SymPy evaluates it in one C call). The power tower of Math-Verify#65
# no longer reaches SymPy (grading.MAX_POWER_DIGITS); this input still does, and only the worker timeout bounds it.
PATHOLOGICAL = r"\boxed{99999999999!}"


@pytest.fixture
def pool():
    with RewardPool(num_workers=2) as p:
        yield p


class Metrics:
    """Stands in for TRL's ``log_metric``."""

    def __init__(self):
        self.values: dict[str, list[float]] = {}

    def __call__(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)


def timed(fn, *args, **kwargs):
    start = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - start


# ---------------------------------------------------------------------------------------------------------------------
# (a) a math-verify input that never finishes


def test_pathological_math_completion_times_out_alone(pool):
    reward = isolate(math_correctness, pool, timeout=TIMEOUT)
    assert isinstance(reward, IsolatedCorrectness)
    completions = [
        r"$1 + 0 = 1$, so the answer is $\boxed{1}$.",
        PATHOLOGICAL,
        r"The answer is $\boxed{2}$.",
        "I do not know.",
        r"So we get $\boxed{\frac{2}{2}}$.",
    ]
    metrics = Metrics()
    rewards, elapsed = timed(reward, completions=completions, solution=[r"\boxed{1}"] * 5, log_metric=metrics)

    assert elapsed < TIMEOUT + SLACK
    assert rewards == [1.0, None, 0.0, 0.0, 1.0]
    assert pool.counters["math_correctness"] == {"timeouts": 1, "errors": 0}
    assert metrics.values["rewards/math_correctness/timeouts"] == [1.0]
    assert metrics.values["rewards/math_correctness/errors"] == [0.0]
    # the timed-out completion is left out of the grade fractions: 2 correct, 1 wrong, 1 unparseable of 4 graded
    assert metrics.values["accuracy"] == [0.5]
    assert metrics.values["grade/wrong"] == [0.25]
    assert metrics.values["grade/unparseable"] == [0.25]


def test_hash_correctness_grades_in_the_workers_as_in_process(pool):
    reward = isolate(hash_correctness, pool, timeout=TIMEOUT)
    assert isinstance(reward, IsolatedCorrectness)
    completions = ["3 + 4 = 7\n#### 7", "3 + 4 = 7", "#### 8"]
    metrics = Metrics()
    rewards = reward(completions=completions, solution=["#### 7"] * 3, log_metric=metrics)
    assert rewards == hash_correctness(completions, solution=["#### 7"] * 3) == [1.0, 0.0, 0.0]
    assert metrics.values["grade/unparseable"] == [pytest.approx(1 / 3)]


# ---------------------------------------------------------------------------------------------------------------------
# (b) a user reward that never returns


def test_hanging_user_reward_is_killed_and_replaced(pool, caplog):
    reward = isolate(reward_plugins.sleeps_forever, pool, timeout=TIMEOUT)
    pids = pool.worker_pids
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rewards, elapsed = timed(reward, completions=["a", "b", "hang here", "c", "d"])
    assert elapsed < TIMEOUT + SLACK
    assert rewards == [1.0, 1.0, None, 1.0, 1.0]
    assert pool.counters["sleeps_forever"] == {"timeouts": 1, "errors": 0}
    assert pool.started_workers == 3  # one replacement
    assert len(set(pool.worker_pids) - set(pids)) == 1
    assert any("'sleeps_forever' timed out" in r.getMessage() for r in caplog.records)

    # the pool keeps working at full strength (no timeout, no replacement), and a second hang costs one more
    # timeout (and replacement) each, not a stall
    assert reward(completions=["e", "f"]) == [1.0, 1.0]
    assert pool.counters["sleeps_forever"] == {"timeouts": 1, "errors": 0} and pool.started_workers == 3
    rewards, elapsed = timed(reward, completions=["hang", "hang again", "g"])
    assert rewards == [None, None, 1.0]
    assert elapsed < 2 * TIMEOUT + SLACK  # two workers: both hangs run side by side
    assert pool.counters["sleeps_forever"]["timeouts"] == 3 and pool.started_workers == 5


# ---------------------------------------------------------------------------------------------------------------------
# (c) a user reward that raises


def test_a_reward_that_fails_now_and_then_says_so_once_and_logs_every_traceback(pool, caplog, tmp_path):
    """A reward raising on some batches printed a traceback per distinct failure (19 in a short run): now one line,
    every traceback in the run's log file, and one summary line at the end."""
    reward = isolate(reward_plugins.boom, pool, timeout=TIMEOUT)
    reward.error_log = tmp_path / "logs" / "reward_errors.log"
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rewards = reward(completions=["ok", "boom", "fine", "boom again"], log_metric=metrics)
    assert rewards == [0.5, None, 0.5, None]
    assert pool.counters["boom"] == {"timeouts": 0, "errors": 2}
    assert metrics.values["rewards/boom/errors"] == [2.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings  # one line, no traceback
    assert "'boom'" in warnings[0] and "ValueError: kaboom" in warnings[0] and str(reward.error_log) in warnings[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert reward(completions=["boom"]) == [None]
    assert not caplog.records  # only counted, and logged to the file
    assert pool.counters["boom"]["errors"] == 3
    assert reward.error_log.read_text().count("reward_plugins.py") == 3  # every worker traceback
    assert (
        reward.summary() == f"reward 'boom' failed on 3 completion(s) (first: ValueError: kaboom: this reward "
        f"cannot score that); every traceback: {reward.error_log}"
    )


def test_worker_that_dies_costs_one_item(pool):
    # a death is seen when it happens (the worker's sentinel), not at the item's deadline: a long timeout, not reached
    reward = isolate(reward_plugins.dies, pool, timeout=LONG_TIMEOUT)
    rewards, elapsed = timed(reward, completions=["a", "die", "b", "c"])
    assert rewards == [1.0, None, 1.0, 1.0]
    assert elapsed < LONG_TIMEOUT
    assert pool.counters["dies"] == {"timeouts": 0, "errors": 1}
    assert reward(completions=["d"]) == [1.0]


def test_wrong_return_shape_is_an_error(pool):
    reward = isolate(reward_plugins.scaled_length, pool, timeout=TIMEOUT)
    assert reward(completions=["abc"]) == [3.0]
    bad = isolate(functools.partial(reward_plugins.scaled_length, scale="x"), pool, name="bad", timeout=TIMEOUT)
    assert bad(completions=["abc"]) == [None]  # "xxx...": not a number
    assert pool.counters["bad"]["errors"] == 1


# ---------------------------------------------------------------------------------------------------------------------
# (d) same results, same order, same metrics as in-process

GSM8K = [
    ("Natalia sold 48 / 2 = 24 clips in May.\nAltogether 48 + 24 = 72.\n#### 72", "#### 72"),
    ("She sold 48 + 24 = 70 clips.\n#### 70", "#### 72"),
    ("The answer is $1,234.00.", "#### 1234"),
    ("I am not sure.", "#### 18"),
    ("5 + 3 = 8, so she has \\boxed{8} apples.", "#### 8"),
    ("So the total is 3/4 of a cup.", "#### 0.75"),
]
MATH = [
    (r"So $x = \boxed{\frac{1}{2}}$.", r"\boxed{0.5}"),
    (r"Hence the answer is $\boxed{\sqrt{2}}$.", r"\boxed{\sqrt 2}"),
    (r"We get $\boxed{3}$.", r"\boxed{4}"),
    ("No boxed answer here.", r"\boxed{7}"),
    (r"The roots are $\boxed{-2}$ and $\boxed{3}$.", r"\boxed{-2, 3}"),
    (r"$\boxed{\pi}$", r"\boxed{\pi}"),
]
R1 = [
    ("<think>1+1</think> <answer>2</answer>", r"\boxed{2}"),
    ("<think>1+1</think> <answer>3</answer>", r"\boxed{2}"),
    ("2", r"\boxed{2}"),
]


@pytest.mark.parametrize(
    ("fn", "cases"),
    [(gsm8k_correctness, GSM8K), (math_correctness, MATH), (r1_zero_correctness, R1)],
    ids=["gsm8k", "math", "r1_zero"],
)
def test_isolated_correctness_matches_in_process(pool, fn, cases):
    cases = cases * 7  # several chunks on each worker
    completions = [c for c, _ in cases]
    solution = [s for _, s in cases]
    expected_metrics, metrics = Metrics(), Metrics()
    expected = fn(completions=completions, solution=solution, log_metric=expected_metrics)
    isolated = isolate(fn, pool, timeout=TIMEOUT)
    got = isolated(completions=completions, solution=solution, log_metric=metrics)
    assert got == expected
    for name in ("accuracy", "grade/wrong", "grade/unparseable"):
        assert metrics.values[name] == pytest.approx(expected_metrics.values[name])


def test_isolated_rewards_match_in_process_conversational(pool):
    completions = [[{"role": "assistant", "content": c}] for c, _ in GSM8K + MATH + R1] * 3
    for fn in (hash_format, length, r1_zero_format):
        assert isolate(fn, pool, timeout=TIMEOUT)(completions=completions) == fn(completions)


# ---------------------------------------------------------------------------------------------------------------------
# (e) warm workers


def test_workers_are_reused_across_calls(pool):
    reward = isolate(reward_plugins.worker_pid, pool, timeout=TIMEOUT)
    pids = set(pool.worker_pids)
    used = set()
    for _ in range(5):
        used |= {int(r) for r in reward(completions=["x"] * 40)}
    assert used <= pids
    assert set(pool.worker_pids) == pids
    assert pool.started_workers == pool.num_workers == 2


# ---------------------------------------------------------------------------------------------------------------------
# (f) nothing left behind


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _is_multiprocessing_helper(p: psutil.Process) -> bool:
    """The fork server and the resource tracker: one each per interpreter, shared by every pool, idle."""
    try:
        cmdline = " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return True
    return "multiprocessing.forkserver" in cmdline or "multiprocessing.resource_tracker" in cmdline


def _is_zombie(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_close_leaves_no_processes():
    before = {p.pid for p in _descendants()}  # e.g. servers started by other tests' fixtures
    pool = RewardPool(num_workers=2)
    reward = isolate(reward_plugins.sleeps_forever, pool, timeout=TIMEOUT)
    reward(completions=["a", "hang"])  # one killed and replaced worker on top of the two
    pids = pool.worker_pids
    assert all(psutil.pid_exists(pid) for pid in pids)
    pool.close()
    pool.close()  # twice is fine
    for pid in pids:
        assert not psutil.pid_exists(pid), f"worker {pid} still exists (a zombie?)"
    left = [p for p in _descendants() if p.pid not in before and not _is_multiprocessing_helper(p)]
    assert left == []
    assert not [p for p in _descendants() if p.pid not in before and _is_zombie(p)]
    with pytest.raises(RuntimeError, match="closed"):
        reward(completions=["a"])


# ---------------------------------------------------------------------------------------------------------------------
# TRL's call shape, loading from recipes


def test_trl_shaped_call(pool):
    reward = isolate(reward_plugins.echo_kwargs, pool, timeout=TIMEOUT)
    metrics, extra = Metrics(), {}
    rewards = reward(
        prompts=["p1", "p2"],
        completions=["c1", "c2"],
        completion_ids=[[1, 2, 3], [4]],
        solution=["#### 12", "#### 3"],
        trainer_state=object(),
        log_extra=lambda column, values: extra.setdefault(column, values),  # a lambda: proves it is not sent
        log_metric=metrics,
    )
    assert rewards == [3.0 + 7, 1.0 + 6]
    assert metrics.values == {"rewards/echo_kwargs/timeouts": [0.0], "rewards/echo_kwargs/errors": [0.0]}


def test_correctness_trl_shaped_call(pool):
    reward = isolate(gsm8k_correctness, pool, name="gsm8k_correctness", timeout=TIMEOUT)
    metrics = Metrics()
    out = reward(
        prompts=["q1", "q2"],
        completions=["#### 7", "#### 8"],
        completion_ids=[[1], [2]],
        solution=["#### 7", "#### 7"],
        trainer_state=object(),
        log_extra=lambda column, values: None,
        log_metric=metrics,
    )
    assert out == [1.0, 0.0]
    assert metrics.values["accuracy"] == [0.5]


def test_load_reward_funcs_isolated():
    funcs = load_reward_funcs(
        RewardArguments(
            reward_funcs=["gsm8k_correctness", "length", "tests.helpers.reward_plugins:scaled_length"],
            reward_kwargs={"tests.helpers.reward_plugins:scaled_length": {"scale": 2.0}},
            reward_workers=1,
            reward_timeout=3.0,
        )
    )
    try:
        assert [f.__name__ for f in funcs] == ["gsm8k_correctness", "length", "scaled_length"]
        assert isinstance(funcs[0], IsolatedCorrectness) and isinstance(funcs[2], IsolatedReward)
        assert funcs[0].pool is funcs[2].pool and funcs[0].pool.num_workers == 1 and funcs[0].timeout == 3.0
        assert funcs[0](completions=["#### 7"], solution=["#### 7"]) == [1.0]
        assert funcs[1](completions=["x" * 60]) == [1.0]
        assert funcs[2](completions=["abc"]) == [6.0]
    finally:
        funcs[0].pool.close()


def test_load_reward_funcs_in_process():
    funcs = load_reward_funcs(
        RewardArguments(
            reward_funcs=["gsm8k_correctness", "tests.helpers.reward_plugins:scaled_length"],
            reward_kwargs={"tests.helpers.reward_plugins:scaled_length": {"scale": 2.0}},
            reward_isolation=False,
        )
    )
    assert funcs[0] is gsm8k_correctness
    assert funcs[1].__name__ == "scaled_length" and funcs[1](completions=["abc"]) == [6.0]


def test_unisolatable_reward_is_refused_at_load_time(pool):
    def closure(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(RewardIsolationError, match="'closure' cannot be sent to a worker process"):
        isolate(closure, pool)
    with pytest.raises(RewardIsolationError, match="lambda"):
        isolate(lambda completions, **kwargs: [0.0], pool, name="inline")
    with pytest.raises(RewardLoadError, match="reward_funcs: reward 'closure_reward' cannot be sent"):
        load_reward_funcs(RewardArguments(reward_funcs=["tests.helpers.reward_plugins:closure_reward"]))


def test_load_errors_still_name_the_reward():
    with pytest.raises(RewardLoadError, match="unknown reward 'gsm8k_corectness'"):
        load_reward_funcs(RewardArguments(reward_funcs=["gsm8k_corectness"]))
    with pytest.raises(RewardLoadError, match="cannot import module 'no_such_module_xyz'"):
        load_reward_funcs(RewardArguments(reward_funcs=["no_such_module_xyz:fn"]))
    with pytest.raises(ValueError, match="reward_timeout"):
        RewardArguments(reward_timeout=0)
    with pytest.raises(ValueError, match="reward_workers"):
        RewardArguments(reward_workers=0)


def test_default_workers_share_the_cores(monkeypatch):
    from hf_grpo.base.workers import cores_per_process

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert cores_per_process() == cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 4))
    assert cores_per_process() == 1


def test_async_rewards_stay_in_process(pool):
    with pytest.raises(RewardIsolationError, match="async"):
        isolate(reward_plugins.async_reward, pool)
    funcs = load_reward_funcs(RewardArguments(reward_funcs=["tests.helpers.reward_plugins:async_reward"]))
    assert funcs[0] is reward_plugins.async_reward


def test_spawn_start_method():
    with RewardPool(num_workers=1, start_method="spawn") as p:
        reward = isolate(reward_plugins.sleeps_forever, p, timeout=TIMEOUT)
        assert reward(completions=["hang", "a"]) == [None, 1.0]
        assert p.counters["sleeps_forever"] == {"timeouts": 1, "errors": 0}
        assert p.started_workers == 2  # the hung worker replaced by a fresh interpreter, which answered "a"
    with pytest.raises(ValueError, match="forkserver"):
        RewardPool(num_workers=1, start_method="fork")


HEAVY_MAIN = """
import os, sys, time
with open(sys.argv[1], "a") as f:  # one line per process that runs this module
    f.write(f"{os.getpid()}\\n")
time.sleep(3)  # stands for importing torch, transformers and TRL (2-12 s under python -m hf_grpo.train)


def main():
    from hf_grpo.rewards.wrapper import RewardPool, isolate
    from tests.helpers import reward_plugins

    pool = RewardPool(num_workers=1)
    reward = isolate(reward_plugins.sleeps_forever, pool, timeout=1.0)
    for _ in range(2):
        assert reward(completions=["hang"]) == [None]
        start = time.perf_counter()
        assert reward(completions=["fine"]) == [1.0]  # answered by the replacement worker
        print(f"replacement {time.perf_counter() - start:.3f}")
    pool.close()


if __name__ == "__main__":
    main()
"""


def test_a_replacement_worker_does_not_rerun_the_main_module(tmp_path):
    """Multiprocessing re-ran the training script (with its torch/TRL imports) in every new worker, so each
    replacement after a timeout cost seconds (2.04 s, 11.8 s on a loaded machine) instead of about 0.1 s."""
    import subprocess
    import sys

    script, runs = tmp_path / "heavy_main.py", tmp_path / "runs"
    script.write_text(HEAVY_MAIN)
    result = subprocess.run(
        [sys.executable, str(script), str(runs)], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(runs.read_text().split()) == 1  # only the script's own process ran it (a line per process that does)
    # both replacements answered (their latency is printed; what made it seconds, the re-run, is the line above)
    assert len([line for line in result.stdout.splitlines() if line.startswith("replacement")]) == 2, result.stdout


def test_a_timed_out_reward_leaves_no_subprocess_behind(pool, tmp_path):
    """A reward that starts a subprocess and hangs left it running, reparented to init, after its worker
    was killed (16 orphaned `sleep` processes after one run)."""
    marker = f"orphan-check-{os.getpid()}-{time.monotonic_ns()}"
    reward = isolate(functools.partial(reward_plugins.spawns_and_hangs, marker=marker), pool, timeout=TIMEOUT)

    def leftovers():
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if marker in " ".join(proc.info["cmdline"] or []):
                    found.append(proc)
        return found

    try:
        assert reward(completions=["anything"]) == [None]
        deadline = time.monotonic() + 10
        while leftovers() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not leftovers()
    finally:
        for proc in leftovers():
            proc.kill()


def test_a_reward_that_kills_the_fork_server_does_not_stop_training(pool):
    """The next worker start raised EOFError from the dead fork server and crashed training. The pool's
    workers die with their fork server (PR_SET_PDEATHSIG); what they were running counts as an error (None), and
    their replacements come from a new fork server."""
    kills = isolate(reward_plugins.kills_fork_server, pool, timeout=TIMEOUT)
    hangs = isolate(reward_plugins.sleeps_forever, pool, timeout=TIMEOUT)
    assert kills(completions=["x"]) in ([1.0], [None])  # its worker may die with the fork server before answering
    assert hangs(completions=["hang"]) == [None]  # a timeout (or a worker found dead): replaced either way
    assert hangs(completions=["fine", "fine"]) == [1.0, 1.0]
    assert hangs(completions=["fine"] * 4) == [1.0] * 4


def test_the_worker_pool_runs_any_function_without_the_rewards():
    """``hf_grpo.base.workers`` is a layer below the rewards: it imports none of them and runs any picklable function."""
    import subprocess
    import sys

    code = """if True:
        import sys
        from hf_grpo.base.workers import WorkerPool
        assert not [m for m in sys.modules if m.startswith("hf_grpo.rewards")]
        with WorkerPool(num_workers=1) as pool:
            done, hung = pool.map(pow, [{"base": 2, "exp": 10}, {"base": 10, "exp": 10**10}], timeout=1.0)
        assert (done.status, done.value, hung.status) == ("ok", 1024, "timeout"), (done, hung)
        assert repr(pool) == "WorkerPool(closed)" and pool.started_workers == 2
    """
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
