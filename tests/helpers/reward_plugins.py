"""User-style reward functions for ``tests/test_reward_isolation.py``: importable by name, as worker processes need.

``sleeps_forever`` hangs on completions containing "hang" (and scores the others), ``boom`` raises on completions
containing "boom", ``dies`` kills its own process on "die", ``worker_pid`` returns the pid of the process that ran it
(to see workers being reused), ``scaled_length`` takes a keyword argument the way ``reward_kwargs`` binds one,
``echo_kwargs`` checks the shape of an isolated call, ``closure_reward`` is a nested function and ``async_reward``
an async one (neither is isolated).
"""

from __future__ import annotations

import math
import os
import re
import time


def _text(completion) -> str:
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def sleeps_forever(completions, **kwargs) -> list[float]:
    """1.0 per completion, except that a completion containing "hang" never returns."""
    for completion in completions:
        if "hang" in _text(completion):
            while True:
                time.sleep(3600)
    return [1.0] * len(completions)


def boom(completions, **kwargs) -> list[float]:
    """Raises ValueError on a completion containing "boom"; 0.5 otherwise."""
    for completion in completions:
        if "boom" in _text(completion):
            raise ValueError("kaboom: this reward cannot score that")
    return [0.5] * len(completions)


def dies(completions, **kwargs) -> list[float]:
    """Ends its process abruptly (like a segfault or the OOM killer) on a completion containing "die"; else 1.0."""
    for completion in completions:
        if "die" in _text(completion):
            os._exit(3)
    return [1.0] * len(completions)


def worker_pid(completions, **kwargs) -> list[float]:
    """The pid of the process that scored each completion."""
    return [float(os.getpid())] * len(completions)


def scaled_length(completions, scale: float = 1.0, **kwargs) -> list[float]:
    """``scale * len(completion)``."""
    return [scale * len(_text(c)) for c in completions]


def echo_kwargs(completions, prompts=None, completion_ids=None, **kwargs) -> list[float]:
    """Checks the single-completion call shape: one prompt, one id list, one value per column, TRL's logging
    callables (proxies in a worker), no environments."""
    assert len(completions) == 1 and len(prompts) == 1 and len(completion_ids) == 1, (completions, prompts)
    assert callable(kwargs.pop("log_metric")) and callable(kwargs.pop("log_extra")), sorted(kwargs)
    kwargs.pop("trainer_state", None)  # TRL passes it from a trainer; a direct call has none
    assert "environments" not in kwargs, sorted(kwargs)
    assert all(isinstance(v, list) and len(v) == 1 for v in kwargs.values()), kwargs
    return [float(len(completion_ids[0]) + len(kwargs["solution"][0]))]


def _make_closure():
    def closure_reward(completions, **kwargs) -> list[float]:
        return [0.0] * len(completions)

    return closure_reward


# A module attribute, but a nested function all the same: pickle cannot find it by name, so it cannot be isolated.
closure_reward = _make_closure()


async def async_reward(completions, **kwargs) -> list[float]:
    """An async reward (TRL awaits these itself; they are not isolated)."""
    return [1.0] * len(completions)


def hangs_once(completions, marker: str, **kwargs) -> list[float]:
    """Hangs forever on the first completion it ever sees (it leaves ``marker`` behind), then scores 1.0.

    The marker is created atomically (O_EXCL): two workers starting at the same moment cannot both win and hang.
    """
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return [1.0] * len(completions)
    while True:
        time.sleep(3600)


def unsloth_answer(prompts, completions, answer, **kwargs) -> list[float]:
    """An Unsloth-notebook-style reward: the dataset's own ``answer`` column by keyword; 2.0 when the completion's
    last number equals it. Also checks that a prompt arrives in its dataset format (a string, or TRL's messages)."""
    rewards = []
    for prompt, completion, gold in zip(prompts, completions, answer, strict=True):
        assert isinstance(prompt, str) or all(isinstance(m, dict) and "role" in m for m in prompt), prompt
        numbers = re.findall(r"-?\d+", _text(completion))
        rewards.append(2.0 if numbers and numbers[-1] == str(gold).split("####")[-1].strip() else 0.0)
    return rewards


def logs_everything(completions, trainer_state, log_metric, log_extra, level, **kwargs) -> list[float]:
    """Logs a metric (the mean completion length) and an extra column (the ``level`` column), and rewards
    ``level / 10 + step / 1000``, so that a missing column or trainer state shows in the reward."""
    lengths = [len(_text(c)) for c in completions]
    log_metric("contract/mean_length", sum(lengths) / len(lengths))
    log_extra("contract_level", list(level))
    return [lv / 10 + trainer_state.global_step / 1000 for lv in level]


def wrong_signature(prompts, completions) -> list[float]:
    """A reward whose signature TRL cannot call (no ``**kwargs`` for the columns): it fails on every completion."""
    return [0.0] * len(completions)


def always_none(completions, **kwargs) -> list[None]:
    """Declines to score anything (None for every completion)."""
    return [None] * len(completions)


def partly_infinite(completions, **kwargs) -> list[float]:
    """+inf for a completion whose length is 0 mod 4, -inf for 1 mod 4, 1.0 for the others."""
    return [{0: math.inf, 1: -math.inf}.get(len(_text(c)) % 4, 1.0) for c in completions]


def spawns_and_hangs(completions, marker: str, **kwargs) -> list[float]:
    """Starts a long-lived subprocess (its command line carries ``marker``) and then hangs forever."""
    import subprocess
    import sys

    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"])
    while True:
        time.sleep(3600)


def kills_fork_server(completions, **kwargs) -> list[float]:
    """SIGKILLs its own parent (the reward workers' fork server), then scores 1.0."""
    import signal

    os.kill(os.getppid(), signal.SIGKILL)
    return [1.0] * len(completions)


def nan_for_odd_lengths(completions, **kwargs) -> list[float]:
    """NaN for a completion of odd length (a reward that means "cannot score" with NaN instead of None), else 1.0."""
    return [math.nan if len(_text(c)) % 2 else 1.0 for c in completions]


# The return types TRL accepts (it does ``torch.tensor(rewards, dtype=torch.float32)``) and some it
# does not. ``as_list`` is the reference: one Python float per completion (its length mod 3, minus 0.5).
def as_list(completions, **kwargs) -> list[float]:
    """``len(completion) % 3 - 0.5`` per completion, as Python floats."""
    return [len(_text(c)) % 3 - 0.5 for c in completions]


def as_bools(completions, **kwargs) -> list[bool]:
    """Python bools: whether the completion's length is even."""
    return [len(_text(c)) % 2 == 0 for c in completions]


def as_numpy_bools(completions, **kwargs):
    """``as_bools`` as ``np.bool_`` values in a list."""
    import numpy as np

    return [np.bool_(v) for v in as_bools(completions)]


def as_numpy_float32s(completions, **kwargs):
    """``as_list`` as a list of ``np.float32``."""
    import numpy as np

    return [np.float32(v) for v in as_list(completions)]


def as_numpy_array(completions, **kwargs):
    """``as_list`` as a 1-D numpy array."""
    import numpy as np

    return np.array(as_list(completions))


def as_tensor(completions, **kwargs):
    """``as_list`` as a 1-D torch tensor."""
    import torch

    return torch.tensor(as_list(completions))


def as_2d_array(completions, **kwargs):
    """``as_list`` as a column, a 2-D array of shape (n, 1): not one reward per completion."""
    import numpy as np

    return np.array(as_list(completions)).reshape(-1, 1)


def as_string(completions, **kwargs) -> str:
    """A string of digits, one per completion: iterable and of the right length, but not numbers."""
    return "1" * len(completions)


def as_dict(completions, **kwargs) -> dict:
    """``{index: reward}``: the right length, but not a list."""
    return dict(enumerate(as_list(completions)))


def one_too_many(completions, **kwargs) -> list[float]:
    """One reward more than there are completions."""
    return [*as_list(completions), 0.0]


def one_too_many_on_rank_1(completions, **kwargs) -> list[float]:
    """Right on every training process but rank 1 (``RANK`` of ``accelerate launch``), where it breaks the contract."""
    return one_too_many(completions) if os.environ.get("RANK") == "1" else as_list(completions)


def fills_the_disk_after_checkpoint_1(completions, run: str, leave: int, **kwargs) -> list[float]:
    """0.0 per completion; once ``checkpoint-1`` of the run in ``run`` is complete (its manifest), fills the filesystem
    it lives on with ``run/../filler`` but for ``leave`` bytes (``reward_kwargs``), so that the next checkpoint's
    writes run out of space part way (the disk filling up mid-run)."""
    filler = os.path.join(run, os.pardir, "filler")
    if os.path.isfile(os.path.join(run, "checkpoint-1", "hf_grpo_checkpoint.json")) and not os.path.exists(filler):
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(1 << 12))
            except OSError:
                pass
            f.truncate(max(f.tell() - leave, 0))
    return [0.0] * len(completions)
