"""vLLM's entry points; the stand-in has the offline ``LLM`` only (``vllm serve``: hf_grpo.vllm_standin.server)."""
