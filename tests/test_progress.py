"""Progress output: Keras' bar on a terminal, plain lines in a log file."""

import contextlib
import io
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_precrop import pai, progress, train

_STEPS, _BATCH, _EPOCHS = 5, 8, 2
_CONTROL = ("\r", "\b", "\x1b")


class _Terminal(io.StringIO):
    """Captured output that says it is a terminal, as an interactive shell's is."""

    def isatty(self):
        return True


def _fit(stdout, model_dir, **kwargs):
    """Trains a tiny classifier for _EPOCHS epochs with its output going to ``stdout``."""

    def build():
        inputs = keras.Input((6, 6, 3))
        x = keras.layers.Conv2D(4, 3)(inputs)
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(3)(x))

    rng = np.random.default_rng(0)
    images = rng.normal(size=(_STEPS * _BATCH, 6, 6, 3)).astype("float32")
    labels = rng.integers(0, 3, size=_STEPS * _BATCH)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(_BATCH)
    model = train.compile_model(build, train.RECIPES["cifar10"], steps_per_epoch=_STEPS,
                                global_batch_size=_BATCH, epochs=_EPOCHS)
    with contextlib.redirect_stdout(stdout):
        train.fit(model, data, data, model_dir=str(model_dir), epochs=_EPOCHS, tensorboard=False, **kwargs)


def test_fit_writes_plain_progress_lines_to_a_log_file(tmp_path):
    log = tmp_path / "train.log"
    with open(log, "w", encoding="utf-8") as f:
        _fit(f, tmp_path / "run", verbose=1, log_every=0)
    text = log.read_text(encoding="utf-8")
    assert not any(c in text for c in _CONTROL), repr(text[:500])
    lines = text.splitlines()
    for epoch in range(1, _EPOCHS + 1):
        start = lines.index(f"Epoch {epoch}/{_EPOCHS}")
        # One plain line per step within the epoch (log_every=0), then Keras' epoch line.
        for step in range(1, _STEPS):
            assert re.fullmatch(rf"{step}/{_STEPS} - \d+s( - (accuracy|loss): [\d.e+-]+){{2}}",
                                lines[start + step]), lines[start + step]
        end = lines[start + _STEPS]
        assert end.startswith(f"{_STEPS}/{_STEPS} - ") and "val_loss" in end


def test_fit_prints_plain_lines_only_every_log_every_seconds(tmp_path):
    out = io.StringIO()
    _fit(out, tmp_path / "run", verbose=1, log_every=3600)
    lines = out.getvalue().splitlines()
    assert [line.split(" - ")[0] for line in lines] == [
        f"Epoch 1/{_EPOCHS}", f"{_STEPS}/{_STEPS}", f"Epoch 2/{_EPOCHS}", f"{_STEPS}/{_STEPS}"]


def test_fit_draws_keras_progress_bar_on_a_terminal(tmp_path):
    out = _Terminal()
    _fit(out, tmp_path / "run", verbose=1, log_every=0)
    assert "\r" in out.getvalue() and "\x1b[" in out.getvalue()


@pytest.mark.parametrize("verbose,lines", [(0, 0), (2, 2 * _EPOCHS)])
def test_fit_verbose_0_is_silent_and_2_prints_each_epoch(verbose, lines, tmp_path):
    out = _Terminal()
    _fit(out, tmp_path / "run", verbose=verbose)
    assert len(out.getvalue().splitlines()) == lines
    assert not any(c in out.getvalue() for c in _CONTROL)


def test_synflow_progress_in_a_log_file_is_plain(tmp_path):
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(8, 3, name="a")(inputs)
    model = keras.Model(inputs, keras.layers.Conv2D(4, 3, name="b")(x))
    log = tmp_path / "synflow.log"
    with open(log, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f):
        pai.synflow(model, 0.5, iterations=4, verbose=1)
    assert re.fullmatch(r"4/4 - \d+s - density: 0.5000\n", log.read_text(encoding="utf-8"))
    terminal = _Terminal()
    with contextlib.redirect_stdout(terminal):
        pai.synflow(model, 0.5, iterations=4, verbose=1)
    assert "\x1b[" in terminal.getvalue()


def test_plain_progress_counts_without_a_target():
    out = io.StringIO()
    bar = progress.PlainProgress(None, interval=0)
    with contextlib.redirect_stdout(out):
        bar.update(3, {"loss": 0.25})
    assert re.fullmatch(r"3 - \d+s - loss: 0.2500\n", out.getvalue())
