"""Models that need no hub: the embedded tiny model (``tiny``) and the pretrained ones that come from the package
index (``registry``: their names and folders; ``from_gguf``: ``hf-grpo model get``). May import ``base`` and ``data``."""
