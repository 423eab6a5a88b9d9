"""Progress output that suits where it goes: a terminal, or a log file.

Keras' progress bar redraws one line with carriage returns, backspaces and
colour codes. On a terminal (or in a notebook, which renders them) that is
right; written to a file or a pipe (``python train.py > train.log``, a batch
job) it fills the log with control characters, because Keras draws it
whenever it runs on a POSIX system. Off a terminal, progress is therefore
printed as plain lines, at most one every ``interval`` seconds, in the format
of Keras' one-line-per-epoch output (``verbose=2``).

Verbosity follows Keras: 0 silent, 1 progress as it goes, 2 one line at the
end (of each epoch, for training).
"""

import sys
import time

from keras_precrop.errors import ArgumentError, is_integer


def interactive():
    """True when the output redraws lines: a terminal, or a Jupyter/Colab kernel."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty()) or "ipykernel" in sys.modules


def check_verbose(verbose):
    """``verbose`` as given: 0, 1 or 2, Keras' values (see the module docstring).

    Raises:
        ArgumentError: naming ``verbose``, for anything else (a bool, a float or a string too).
    """
    if not is_integer(verbose) or verbose not in (0, 1, 2):
        raise ArgumentError("{verbose} must be 0 (silent), 1 (progress as it goes) or 2 (one "
                            "line at the end), as Keras' verbose.", verbose=verbose)
    return verbose


def fit_verbose():
    """Keras ``fit``'s ``verbose`` for the output: 1 (the progress bar) on a terminal, else 2.

    ``verbose=2`` prints an ``Epoch i/n`` header and one plain line at the end
    of each epoch, without the bar's carriage returns and colour codes, which
    Keras would otherwise write into a log file or a pipe (see the module
    docstring).
    """
    return 1 if interactive() else 2


class PlainProgress:
    """Progress as plain lines: ``step/target - elapsed - name: value ...``.

    A drop-in for ``keras.utils.Progbar``'s ``update`` that writes one line
    whenever ``interval`` seconds have passed since the last one (or since
    the start), and one at the target step.

    Args:
        target: total steps, or None if unknown.
        interval: least seconds between two lines.
        last_line: also print a line when ``target`` is reached (off when
            the caller prints its own final line, like Keras' epoch line).
    """

    def __init__(self, target, interval=30.0, last_line=True):
        self.target = target
        self.interval = interval
        self.last_line = last_line
        self._start = self._last = time.monotonic()

    def update(self, current, values=()):
        """Print a line for step ``current`` if it is due.

        Args:
            current: steps done so far.
            values: ``(name, number)`` pairs (or a dict) shown after the
                counts, e.g. the running loss.
        """
        now = time.monotonic()
        done = self.target is not None and current >= self.target
        if not (self.last_line if done else now - self._last >= self.interval):
            return
        self._last = now
        count = f"{current}/{self.target}" if self.target is not None else f"{current}"
        items = values.items() if isinstance(values, dict) else values
        text = "".join(f" - {name}: {_number(value)}" for name, value in items)
        print(f"{count} - {now - self._start:.0f}s{text}", flush=True)


def _number(value):
    """A metric as Keras' progress output writes it: 4 decimals, tiny ones in e-notation."""
    value = float(value)
    return f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"


def progbar(target, verbose=1, interval=30.0, **kwargs):
    """A progress display for ``target`` steps that suits the output.

    Args:
        target: total steps.
        verbose: 0 silent, 1 progress as it goes, 2 one line at the end.
        interval: least seconds between plain lines (off a terminal).
        **kwargs: more ``keras.utils.Progbar`` arguments (``stateful_metrics``).

    Returns:
        ``keras.utils.Progbar`` on a terminal, or with ``verbose`` 0 or 2
        (which print no control characters); :class:`PlainProgress` for
        ``verbose=1`` off a terminal. Both have ``update(current, values)``.
    """
    if verbose == 1 and not interactive():
        return PlainProgress(target, interval)
    import keras

    return keras.utils.Progbar(target, verbose=verbose, **kwargs)
