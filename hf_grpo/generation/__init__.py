"""Generation backends for the trainer; ``vllm_client`` talks to a ``vllm serve`` server over HTTP."""
