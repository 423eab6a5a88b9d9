"""Makes TensorFlow look uninstalled in this interpreter (and in the processes it starts).

``tests/test_backends.py`` puts this folder first on ``PYTHONPATH``, so Python
imports this module at start-up. The path finder stops finding ``tensorflow``
and its submodules: ``import tensorflow`` raises ``ModuleNotFoundError`` and
``importlib.util.find_spec("tensorflow")`` returns None, exactly as on a
machine where only Keras with JAX or PyTorch is installed.
"""

import importlib.machinery
import sys

_HIDDEN = "tensorflow"


class _PathFinderWithoutTensorFlow(importlib.machinery.PathFinder):
    """The standard path finder, blind to one top-level package."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] == _HIDDEN:
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [
    _PathFinderWithoutTensorFlow if finder is importlib.machinery.PathFinder else finder
    for finder in sys.meta_path
]
