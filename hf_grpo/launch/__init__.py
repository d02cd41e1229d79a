"""Starting the processes of a run: ``processes`` (accelerate config, process count, machines, this node),
``hardware`` (what this machine can run) and ``launcher`` (``python -m hf_grpo.train``'s launch and its vLLM server).
May import ``base``, ``generation`` and ``training.checkpoints``."""
