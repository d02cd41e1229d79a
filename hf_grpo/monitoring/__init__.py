"""Watching a run while it trains: the run watch (``run_watch``: collapse, hacking, forgetting, plateau, the adapter
a run keeps, with their error rate) and the experiment trackers (``trackers``). May import ``publish`` and below."""
