"""One run's life in this process: ``pipeline.run`` (build, train, write the outputs), ``phases`` (the evaluations
around training, the watch, the run's phase in its manifest) and ``finishing`` (a resume or report of a run that
trained: only what it lacks). The top of the package below the entry points: it may import every folder."""
