"""One process of a 2-process gloo group (argv: rank, port, cache folder): builds the miniature's assets into its own
cache, as each machine of a multi-node miniature does, and prints the model folder's files. Used by
tests/test_miniature_plan.py."""

import datetime
import os
import sys

import torch.distributed as dist

from hf_grpo.miniature.assets import AssetSpec, PromptFormat, SplitSpec, ensure_assets


rank, port, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HF_GRPO_CACHE=cache)
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
splits = (SplitSpec("train", "openai/gsm8k", "train", "question", "answer", "gsm8k"),)
assets = ensure_assets(AssetSpec("llama", 0, PromptFormat(prompt_style="r1_zero"), "r1_zero", splits))
print("files:", " ".join(sorted(p.name for p in assets.model_dir.iterdir())))
dist.barrier()
dist.destroy_process_group()
