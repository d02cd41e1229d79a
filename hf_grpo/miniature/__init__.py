"""Miniatures: any recipe, run for a few optimizer steps on a CPU through the same code path as on its GPUs.

    python -m hf_grpo.train recipes/qwen7b.yaml --miniature            # trains on a laptop in minutes
    python -m hf_grpo.train recipes/qwen7b.yaml --miniature --dry-run  # prints exactly what is swapped

A miniature keeps the recipe's accelerate config (ZeRO-3 with ``zero3_init_flag``, ZeRO-2 with CPU offload, FSDP2,
the multi-node config as processes on one machine), its generation layout, rewards, loss, advantage estimator,
dynamic sampling, before/after evaluation and checkpointing. It swaps only:

- the model: a tiny model of the same architecture family, built locally and warm-started on the miniature data in
  the recipe's own prompt and answer format (``hf_grpo.miniature.assets``), loaded through the recipe's own
  ``from_pretrained`` path;
- the data: local files with the recipe's dataset schema standing in for the hub splits (``dataset_mirror``);
- the sizes: steps, batch, group size, completion length, evaluation sizes, process count (2);
- what a CPU cannot run, mapped in one table here and printed: bf16/fp16 mixed precision, CUDA-only kernels and
  transports; vLLM, replaced by CPU stand-ins that speak its APIs (``hf_grpo.miniature.vllm_server`` for
  ``vllm serve``, the ``standin/vllm`` package for TRL's colocated ``vllm.LLM``).
"""
