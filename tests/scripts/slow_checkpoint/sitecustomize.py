"""Test instrumentation for ``tests/test_launch_resume.py``, active only with this folder (and tests/scripts, for
``patch_on_import``) on PYTHONPATH: every training process stops for two minutes inside its second checkpoint write,
after the model and optimizer files and before the RNG state, trainer state and manifest, so that a test can signal
the run at exactly that phase. The main process writes the checkpoint's path to ``$HF_GRPO_TEST_SLOW_SAVE`` when it
gets there. The code under test is unchanged."""

import os
import time

from patch_on_import import PatchOnImport  # tests/scripts, on PYTHONPATH after this folder


FLAG = os.environ.get("HF_GRPO_TEST_SLOW_SAVE")


def slow_down(trainer_class) -> None:
    original, saves = trainer_class._save_rng_state, []

    def save_rng_state(self, output_dir):
        saves.append(output_dir)
        if len(saves) == 2:
            if self.args.process_index == 0:
                with open(FLAG, "w") as f:
                    f.write(output_dir)
            time.sleep(120)
        return original(self, output_dir)

    trainer_class._save_rng_state = save_rng_state


if FLAG:
    PatchOnImport("transformers.trainer", lambda module: slow_down(module.Trainer)).install()
