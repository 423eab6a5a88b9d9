"""A quiet start for the ``keras-precrop`` command.

TensorFlow's C++ runtime writes start-up banners to stderr when it is
imported (oneDNN and CPU-feature notices, preceded by absl's "log messages
before absl::InitializeLog()" warning), before its logging reads
``TF_CPP_MIN_LOG_LEVEL``. A command should print only its own output.
``import keras_precrop`` loads no Keras, so both ``python -m keras_precrop``
and the ``keras-precrop`` console script (``keras_precrop.cli:main``) parse
their arguments first (``--help`` and argument errors never load
TensorFlow); the command then calls :func:`quiet_command` before anything
imports Keras: when this process is the command it sets TensorFlow's log
level and imports Keras with stderr muted. A library import, and a test
calling ``main`` in-process, are left exactly as Keras makes them.

This module imports nothing heavy.
"""

import contextlib
import os
import re
import sys

COMMAND = "keras-precrop"


def _module_run(orig_argv):
    """The module named after ``-m`` on the interpreter's command line, or ``""``."""
    for i, arg in enumerate(orig_argv[1:], start=1):
        if arg == "-m":
            return orig_argv[i + 1] if i + 1 < len(orig_argv) else ""
        if arg.startswith("-m"):
            return arg[2:]
    return ""


def is_command(argv, orig_argv):
    """Whether a process with these ``sys.argv``/``sys.orig_argv`` runs the command.

    The console script's ``argv[0]`` is the script (``keras-precrop``, or
    ``keras-precrop.exe`` / ``keras-precrop-script.py`` on Windows). Under
    ``python -m`` the module run is on the original command line (``argv[0]``
    is ``"-m"`` while its package is imported, then the module's file).
    """
    if not argv:
        return False
    script = re.split(r"[/\\]", argv[0])[-1]  # a POSIX or a Windows path
    if re.sub(r"(-script\.pyw?|\.exe)$", "", script) == COMMAND:
        return True
    return _module_run(orig_argv).split(".")[0] == __package__


@contextlib.contextmanager
def _stderr_muted():
    """Send file descriptor 2 to the null device, C++ writes included."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quiet_command():
    """In the command, import Keras (and TensorFlow) without start-up banners."""
    if "keras" in sys.modules or not is_command(sys.argv, getattr(sys, "orig_argv", [])):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _stderr_muted():
        import keras  # noqa: F401  (an error is raised, and shown, after stderr is back)
