"""vLLM 0.30's weight transfer, trainer side, over ``hf_grpo.miniature.transport`` (TCP on 127.0.0.1, not NCCL)."""
