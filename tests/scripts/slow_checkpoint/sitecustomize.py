"""Test instrumentation for ``tests/test_checkpoints.py``, active only with this folder on PYTHONPATH: every training
process stops for two minutes inside its second checkpoint write, after the model and optimizer files and before the
RNG state, trainer state and manifest, so that a test can signal the run at exactly that phase. The main process
writes the checkpoint's path to ``$HF_GRPO_TEST_SLOW_SAVE`` when it gets there. The code under test is unchanged."""

import importlib.abc
import importlib.util
import os
import sys
import time


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


class PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "transformers.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            slow_down(module.Trainer)

        spec.loader.exec_module = exec_module
        return spec


if FLAG:
    sys.meta_path.insert(0, PatchOnImport())
