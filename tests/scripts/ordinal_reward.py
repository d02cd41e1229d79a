"""A reward with a learning signal in every group, whatever the policy writes: ``tests.scripts.ordinal_reward:ordinal``.

Each completion of a process's batch gets its position in that batch, so no group's rewards are all equal and every
step has a nonzero policy gradient. It needs the whole batch in one call: run it with ``reward_isolation: false``
(isolated, each completion is scored on its own). Used where a test must see weights move and the tiny policy may
answer every sample of a step wrong (tests/test_miniatures.py).
"""


def ordinal(completions, **kwargs) -> list[float]:
    return [float(i) for i in range(len(completions))]
