"""Patch a module right after its first import, in a process that a test starts: a ``sitecustomize`` on that
process's PYTHONPATH installs ``PatchOnImport(name, patch)``. The code under test is otherwise as is.

Imported as ``patch_on_import`` (this folder on the child's PYTHONPATH): a ``sitecustomize`` runs before the child's
working directory is on ``sys.path``, so the ``tests`` package cannot be imported there."""

import importlib.abc
import importlib.util
import sys


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the module ``name`` once (then leaves ``sys.meta_path``) and calls ``patch(module)`` after it ran."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec

    def install(self) -> None:
        sys.meta_path.insert(0, self)
