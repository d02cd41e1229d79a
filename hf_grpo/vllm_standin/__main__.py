"""``python -m hf_grpo.vllm_standin MODEL_DIR [vllm serve flags]``: the CPU stand-in for ``vllm serve`` (``cli``)."""

from .cli import main


main()
