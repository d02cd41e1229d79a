"""The vLLM version hf_grpo's CPU stand-in claims (its ``vllm-0.30.0.dist-info`` says the same)."""

__version__ = "0.30.0"
__version_tuple__ = (0, 30, 0)
