"""A run's outputs for people: ``run_result.RunResult`` (the run in memory, or read back from its folder), the plot
and ``summary.md`` (``report``, ``plot``, ``summary``), the model card (``card``, ``templates/``) and the Hub push
(``hub``). May import everything below the recipe and ``recipe``; nothing of a running training."""
