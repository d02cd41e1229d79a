"""Names of the files a training run writes into its ``output_dir``; the trainer, reports, evaluation and the Hub
push all read them from here."""

RECIPE_FILE = "recipe.yaml"  # the resolved recipe (hf_grpo.pipeline.save_recipe)
VERSIONS_FILE = "versions.json"  # library versions at training time (hf_grpo.pipeline.save_recipe)
HISTORY_FILE = "training_history.json"  # one record per logged step (hf_grpo.evaluation.history)
EVAL_FILE = "eval_results.json"  # held-out accuracy before and after training (hf_grpo.train)
PLOT_FILE = "training_curves.png"  # the training plot (hf_grpo.evaluation.report.choose_panels)
SUMMARY_FILE = "summary.md"  # the Markdown summary (hf_grpo.evaluation.report)
EVAL_RECORDS = "eval_{label}.jsonl"  # per-problem held-out records, label before / after / stepN (evaluation.tasks)
LOCK_FILE = "hf_grpo.lock"  # the run writing into output_dir: pid, host, command (hf_grpo.run_lock)
