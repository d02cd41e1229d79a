"""What every other part may use, importing nothing of hf_grpo: the run folder's file names, manifest and phase
(``run_files``), its lock (``run_lock``), crash logs, stop signals (``stopping``), the launcher's watchdog, progress
bars, the Hub token from the environment, and the worker pool that runs rewards and grading with a timeout."""
