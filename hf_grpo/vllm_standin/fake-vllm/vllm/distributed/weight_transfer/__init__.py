"""vLLM 0.30's weight transfer, trainer side, over ``hf_grpo.vllm_standin.transport`` (TCP on 127.0.0.1, not NCCL)."""
