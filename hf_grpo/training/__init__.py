"""The GRPO trainer and what it calls each step: ``trainer.GRPOTrainer`` (TRL's, with narrow overrides), dynamic
sampling and prompt selection, advantages, the shared-prompt forward, micro-batches, the KL reference pass, the warm
start before GRPO, checkpoints and the time-left line. May import ``base``, ``data``, ``rewards``, ``generation``,
``evaluation`` and ``models``."""
