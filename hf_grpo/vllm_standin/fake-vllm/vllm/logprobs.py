"""vLLM 0.30's logprob containers (``vllm/logprobs.py``): ``Logprob`` and the per-position dict layout.

``CompletionOutput.logprobs`` is a list with one ``dict[token_id, Logprob]`` per generated token, holding the
sampled token and the top-k ones (the stand-in does not implement ``FlatLogprobs``, vLLM's ``flat_logprobs=True``).
"""

from dataclasses import dataclass


@dataclass
class Logprob:
    """A token's logprob, its rank in the distribution (1 = most likely) and its decoded text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


LogprobsOnePosition = dict[int, Logprob]
SampleLogprobs = list[LogprobsOnePosition]
PromptLogprobs = list[LogprobsOnePosition | None]
