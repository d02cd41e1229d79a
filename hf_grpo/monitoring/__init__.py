"""Watching a run while it trains: the run watch (``run_watch``: collapse, hacking, forgetting, plateau, the adapter
a run keeps, with their error rate), the experiment trackers (``trackers``) and the console's line per logged step
(``console``). May import ``publish`` and below."""
