"""hf_grpo's CPU stand-in for the ``vllm`` package, claiming vLLM 0.30.0. It is not vLLM.

It is importable only after ``hf_grpo.vllm_standin.activate()`` has put its parent directory first on
``sys.path`` (miniature runs and tests do that; a plain ``import hf_grpo`` never does). It provides what TRL 1.16
imports and calls, under vLLM 0.30's module paths and names: ``LLM``, ``SamplingParams``, ``RequestOutput``,
``CompletionOutput`` (here and in their own modules), ``vllm.sampling_params.StructuredOutputsParams``,
``vllm.logprobs.Logprob``, ``vllm.utils.network_utils.get_ip``, and the trainer side of the weight transfer
(``vllm.distributed.weight_transfer.nccl_common.trainer_init`` and
``vllm.distributed.weight_transfer.packed_tensor.packed_nccl_broadcast_producer``), whose group moves CPU tensors
over TCP on 127.0.0.1 to ``hf_grpo.vllm_standin.server``. What each piece does and does not do is in its module.
"""

from vllm.version import __version__, __version_tuple__


__hf_grpo_standin__ = True  # hf_grpo.vllm_standin tells the stand-in from a real vLLM by this

_ATTRS = {
    "LLM": "vllm.entrypoints.llm",
    "SamplingParams": "vllm.sampling_params",
    "RequestOutput": "vllm.outputs",
    "CompletionOutput": "vllm.outputs",
    "TokensPrompt": "vllm.inputs",
    "TextPrompt": "vllm.inputs",
}


def __getattr__(name: str):
    if name in _ATTRS:
        import importlib

        return getattr(importlib.import_module(_ATTRS[name]), name)
    raise AttributeError(
        f"module 'vllm' has no attribute {name!r}: hf_grpo's CPU stand-in for vLLM provides {sorted(_ATTRS)}"
    )


__all__ = [
    "LLM",
    "CompletionOutput",
    "RequestOutput",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
    "__version__",
    "__version_tuple__",
]
