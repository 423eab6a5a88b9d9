"""One check of user data against the model it is for, before any of it reaches Keras.

``data=`` of Taylor importance (``precrop``, ``apply_plan``) and
``fine_tune``'s ``train_data=`` / ``validation_data=`` come in four forms:
an ``(x, y)`` pair of arrays, a ``tf.data.Dataset`` of batches, a
``keras.utils.PyDataset``, or any iterable of batches (a generator, a list, a
``torch`` ``DataLoader``). :func:`check_data` reads the first batch (the
first ``batch_size`` rows of arrays; an iterator's batch is put back) and
refuses, with a :class:`~keras_precrop.errors.DataError` whose message starts
with the user's argument (``data=``, ``train_data=``), data that would
otherwise fail deep inside Keras or TensorFlow, or train silently wrong:
inputs of another shape than the model's or not numbers, non-finite values,
labels that are not numbers, not class indices within the model's classes,
or one-hot rows of another width, no batch at all, and an infinite dataset
where the caller has no batch count to bound it.

Arrays are checked whole, which is cheap: every input finite, every label
a class, as many labels as inputs (labels given as a Python list are made an
array, as a model of one output reads them). A dataset, a generator or a
``PyDataset`` is checked on its first batch only (reading it all would cost
an epoch); ``fine_tune`` stops with a ``LossNotFiniteError`` where a later
batch makes the loss NaN. Models with several inputs or outputs have their
inputs and labels passed on unchecked, but for their counts.
"""

from __future__ import annotations

import sys
import typing

import keras
import numpy as np

from keras_precrop.errors import NAME_ONLY, DataError

_CHUNK = 1024  # examples checked for finiteness at a time: no copy of a whole large array

FORMS = ("(x, y) arrays, a tf.data.Dataset or keras.utils.PyDataset of (x, y) batches, "
         "or an iterable of (x, y) batches")


def check_data(model, data, argument, *, labels=True, classes=True, bound=None, batch_size=None):
    """Checks ``data`` against ``model`` and returns it, ready to read from its start.

    Args:
        model: the model the data is fed to.
        data: the user's data, in one of the forms of the module docstring.
        argument: the user's name for it (``"data"``, ``"train_data"``).
        labels: whether batches must hold labels (``(x, y)``), or may be
            inputs alone (labels given then are not read, nor checked).
        classes: whether the labels are class indices or one-hot rows of
            the model's (single) output; False for another loss.
        bound: ``(name, value)`` of the caller's argument that bounds the
            batches read from an infinite dataset (``("steps_per_epoch",
            None)``), or None where there is no such argument.
        batch_size: rows per batch of arrays (default 32).

    Returns:
        A :class:`Checked`.

    Raises:
        DataError: naming ``argument``, saying what was expected.
    """
    first, data = _first_batch(_labels_as_array(model, data), argument, bound, batch_size or 32)
    inputs, y = _split_batch(first, argument, labels)
    _check_inputs(model, inputs, argument)
    whole = data if is_pair(data) else (data, None) if is_array(data) else None
    x, y = whole or (inputs, y)  # arrays: every example; other forms: the first batch
    where = "" if whole else " of its first batch"
    _check_finite(x, argument, "inputs", where)
    if y is None or not labels:  # labels given where none are read are not checked either
        return Checked(data, None, inputs)
    _check_lengths(x, y, argument, where)
    return Checked(data, _check_labels(model, inputs, y, argument, classes, where), inputs)


class Checked(typing.NamedTuple):
    """What :func:`check_data` found.

    Attributes:
        data: the data to use: the user's, or for an iterator a generator
            that yields the batch read first again.
        labels: ``"sparse"`` (class indices), ``"one-hot"``, or None (no
            labels, or their classes not checked).
        inputs: the inputs of the first batch.
    """

    data: object
    labels: str | None
    inputs: object


def array_batches(arrays, batch_size, limit=None):
    """``arrays`` (an array, or a pair or other structure of arrays of equal length) cut into
    batches of ``batch_size`` rows, the way a loop of model calls reads them.

    Slices are views, so the list costs no copy and can be read more than once
    (``GradualPruning`` reads its ``data=`` at every update).

    Args:
        arrays: the rows, e.g. ``(x, y)``.
        batch_size: rows a batch; the last batch may be shorter.
        limit: only the batches that start before this row (``None``: all).
    """
    rows = len(keras.tree.flatten(arrays)[0])
    stop = rows if limit is None else min(rows, limit)
    return [keras.tree.map_structure(lambda a, s=start: a[s:s + batch_size], arrays)
            for start in range(0, stop, batch_size)]


def outputs_probabilities(model, inputs=None):
    """Whether ``model``'s (single) output is a softmax's probabilities rather than logits.

    Read from the model's last layer (``activation="softmax"``, a ``Softmax``
    or ``Activation("softmax")`` layer, ``keras.ops.softmax``, through
    nested models); for a subclassed model, whose last layer cannot be read,
    from its outputs on ``inputs`` (rows of non-negative numbers summing to 1).
    """
    outputs = getattr(model, "outputs", None)
    if outputs is None:
        if inputs is None or isinstance(inputs, (dict, list, tuple)):
            return False
        out = model(_array(inputs)[:8], training=False)
        if isinstance(out, (dict, list, tuple)):
            return False
        out = _array(out)
        return out.shape[-1] > 1 and bool(np.all(out >= 0) and np.allclose(out.sum(-1), 1, atol=1e-4))
    if len(outputs) != 1:
        return False
    last = outputs[0]._keras_history.operation
    while getattr(last, "outputs", None) is not None and len(last.outputs) == 1:  # a nested model
        last = last.outputs[0]._keras_history.operation
    return type(last).__name__ == "Softmax" or getattr(
        getattr(last, "activation", None), "__name__", "") == "softmax"


def _refuse(argument, text):
    """A :class:`DataError` whose message is ``argument=`` followed by ``text``."""
    return DataError("{" + argument + ":=} " + text.replace("{", "{{").replace("}", "}}"),
                     **{argument: NAME_ONLY})


def is_pair(data):
    """Whether ``data`` is one ``(x, y)`` pair of arrays (as ``fine_tune`` and Taylor read it), not
    two batches: ``x`` may be several inputs (a list, a dict, or a tuple where ``y`` is no
    tuple or list; two ``(x, y)`` batches are a tuple of tuples)."""
    return isinstance(data, tuple) and len(data) == 2 and not (
        isinstance(data[0], tuple) and isinstance(data[1], (tuple, list)))


def is_array(data):
    """Whether ``data`` is one array (inputs alone): NumPy's, or a tensor of any backend."""
    return hasattr(data, "shape") and hasattr(data, "dtype")


def _labels_as_array(model, data):
    """``data`` with the labels of an ``(x, y)`` pair made an array where they are a Python list of
    numbers or rows (``y=[0, 2, 1, ...]``) and the model has one output; Keras would read a list
    as one label array per output. A list of arrays (one an output) stays as it is."""
    if not (is_pair(data) and isinstance(data[1], list) and data[1]):
        return data
    outputs = getattr(model, "outputs", None)
    first = data[1][0]
    if (outputs is None or len(outputs) == 1) and (np.ndim(first) == 0 or isinstance(first, list)):
        return data[0], np.asarray(data[1])
    return data


def _first_batch(data, argument, bound, batch_size):
    """``(first batch, data to use)``: the batch read first, and ``data`` with nothing lost."""
    if is_pair(data) or is_array(data) or isinstance(data, dict):  # (a dict: several inputs)
        inputs = data[0] if is_pair(data) else data
        if not isinstance(inputs, (dict, list, tuple)) and len(inputs) == 0:
            raise _refuse(argument, "is empty: it holds no example.")
        if is_pair(data):
            return tuple(None if part is None else _head(part, batch_size) for part in data), data
        return _head(data, batch_size), data
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(data, tf.data.Dataset):
        _check_finite_dataset(data.cardinality() == tf.data.INFINITE_CARDINALITY,
                              "tf.data.Dataset", argument, bound)
        return _next(iter(data.take(1)), argument), data
    if isinstance(data, keras.utils.PyDataset):
        count = _num_batches(data, argument)
        _check_finite_dataset(count is None, "PyDataset", argument, bound)
        if count == 0:
            raise _refuse(argument, "is empty: it has no batch.")
        return data[0], data
    try:
        iterator = iter(data)
    except TypeError:
        raise _refuse(argument, f"must be {FORMS}; got a {type(data).__name__}.") from None
    first = _next(iterator, argument)
    if iterator is data:  # a generator or iterator: give back the batch it has yielded
        return first, _chained(first, iterator)
    return first, data


def _head(part, n):
    """The first ``n`` examples of an array (several inputs, a list, tuple or dict, or a scalar:
    one example's label, whole)."""
    return part if isinstance(part, (dict, list, tuple)) or np.ndim(part) == 0 else part[:n]


def _num_batches(data, argument):
    """A ``PyDataset``'s ``num_batches`` (None: infinite); one that defines neither it nor a
    length is refused."""
    try:
        return data.num_batches
    except NotImplementedError:
        raise _refuse(argument, "is a PyDataset with neither __len__ nor num_batches: define one "
                                "(num_batches returning None for an infinite one).") from None


def _check_finite_dataset(infinite, kind, argument, bound):
    """Refuses an infinite dataset unless the caller's batch-count argument is given."""
    if not infinite or (bound is not None and bound[1] is not None):
        return
    if bound is None:
        raise _refuse(argument, f"is an infinite {kind}, and every batch of it would be read. "
                                "Pass a finite one, e.g. dataset.take(8) for 8 batches.")
    raise _refuse(argument, f"is an infinite {kind}: pass {bound[0]}= (the number of batches to "
                            "read per epoch), or a finite dataset.")


def _next(iterator, argument):
    """The first item of ``iterator``; an empty one is refused."""
    try:
        return next(iterator)
    except StopIteration:
        raise _refuse(argument, "is empty: it yielded no batch.") from None


def _chained(first, rest):
    """A generator of ``first`` and then the rest of the iterator it came from."""
    yield first
    yield from rest


def _split_batch(batch, argument, labels):
    """``(x, y)`` of one batch (``y`` None where there are no labels)."""
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        if labels and batch[1] is None:
            raise _refuse(argument, "must give labels: its (x, y) has y=None.")
        return batch[0], batch[1]
    if labels:
        raise _refuse(argument, f"must give (x, y) batches: inputs and their labels; its first "
                                f"batch is a {type(batch).__name__}, not an (x, y) pair.")
    return (batch[0] if isinstance(batch, (tuple, list)) and len(batch) == 1 else batch), None


def _array(value):
    """``value`` (a numpy array, a tensor of any backend, a list) as a numpy array."""
    return np.asarray(value)


def _check_inputs(model, x, argument):
    """The inputs of one batch: numbers, finite, and of the shape of the model's (single) input."""
    inputs = getattr(model, "inputs", None)
    if isinstance(x, list) and x and not all(is_array(part) for part in x):
        raise _refuse(argument, f"has inputs as a Python list of {type(x[0]).__name__}s; Keras "
                                "reads a list as one array per model input: pass an array, "
                                "np.asarray(x).")
    several = inputs is not None and len(inputs) != 1
    if several and is_array(x):
        names = [t._keras_history.operation.name for t in inputs]
        raise _refuse(argument, f"gives one array of inputs a batch, but {_name(model)} takes "
                                f"{len(inputs)} ({names}): give each batch's inputs as a dict by "
                                "those names (a pair [a, b] of arrays alone is read as (x, y)).")
    if isinstance(x, (dict, list, tuple)) or several:
        return  # several inputs: Keras matches them to the model's itself
    x = _array(x)
    if not _numeric(x.dtype):
        raise _refuse(argument, f"has inputs of dtype {x.dtype}; {_name(model)} takes numbers.")
    if inputs is not None:
        expected = tuple(inputs[0].shape)
        if not _fits(x.shape, expected):
            raise _refuse(argument, _shape_problem(x.shape, expected, model))


def _numeric(dtype):
    """Whether arrays of ``dtype`` hold numbers a model reads (ml_dtypes' bfloat16, no NumPy
    number, too)."""
    return np.issubdtype(dtype, np.number) or str(dtype) in ("bool", "bfloat16")


def _check_finite(values, argument, what, where):
    """Refuses NaN or infinite ``values`` (``what``: inputs or labels, a row an example), naming
    how many examples hold one and the first; read ``_CHUNK`` examples at a time.

    Arrays of integers (and several inputs or outputs) cannot hold one and are not read.
    """
    if isinstance(values, (dict, list, tuple)) or not len(values):
        return
    if not np.issubdtype(_array(values[:1]).dtype, np.floating):
        return
    bad = np.concatenate([_bad_rows(_array(values[i:i + _CHUNK]))
                          for i in range(0, len(values), _CHUNK)])
    if bad.any():
        rows = f"its {len(bad)} examples" if not where else f"the {len(bad)} examples{where}"
        raise _refuse(argument, f"has NaN or infinite {what} in {int(bad.sum())} of {rows}, the "
                                f"first at index {int(np.argmax(bad))}: training on them turns every "
                                "weight to NaN. Drop or repair those examples.")


def _bad_rows(chunk):
    """Which rows (examples) of ``chunk`` hold a NaN or an infinity."""
    return ~np.isfinite(chunk.reshape(len(chunk), -1)).all(axis=1)


def _name(model):
    """``model 'name'``, as messages call the user's model."""
    return f"model {model.name!r}"


def _example(shape):
    """One example's shape of a batch ``shape``, open sizes written as ``any``."""
    return "(" + ", ".join("any" if d is None else str(d) for d in shape[1:]) + (
        ",)" if len(shape) == 2 else ")")


def _fits(given, expected):
    """Whether a batch of shape ``given`` fits an input of shape ``expected`` (batch first)."""
    return len(given) == len(expected) and all(
        e is None or e == g for e, g in zip(expected[1:], given[1:]))


def _shape_problem(given, expected, model):
    """What is wrong with inputs of shape ``given`` for ``model``'s input of shape ``expected``."""
    takes = f"{_name(model)} takes inputs of shape {expected}"
    if _fits((None, *given), expected):  # single examples: ``dataset.batch(n)`` left out
        return (f"gives single examples of shape {tuple(given)}, not batches of them ({takes}): "
                "batch them, e.g. dataset.batch(32), or x[None] for one example.")
    return (f"has inputs of shape {tuple(given)} (a batch of {_example(given)}); {takes}: "
            f"every example must be {_example(expected)}.")


def _check_lengths(x, y, argument, where):
    """Inputs and labels hold as many examples (the first input's and output's, of several)."""
    n, m = (len(keras.tree.flatten(part)[0]) for part in (x, y))
    if n != m:
        raise _refuse(argument, f"has {n} inputs but {m} labels{where}: x holds {n} examples and "
                                f"y {m}, and each input needs its label, in the same order.")


def _output_shape(model, x, argument):
    """The shape of the model's single output (batch first), or None (several, or unknown)."""
    outputs = getattr(model, "outputs", None)
    if outputs is not None:
        return tuple(outputs[0].shape) if len(outputs) == 1 else None
    if isinstance(x, (dict, list, tuple)):
        return None
    try:  # a subclassed model: its output shape is known only by running it
        out = model(_array(x)[:1], training=False)
    except Exception as err:  # noqa: BLE001 - whatever fails, it fails on the user's inputs
        raise _refuse(argument, f"has inputs of shape {tuple(_array(x).shape)} that "
                                f"{_name(model)} cannot run on: {err}") from err
    return None if isinstance(out, (dict, list, tuple)) else (None, *np.shape(out)[1:])


def _check_labels(model, x, y, argument, classes, where):
    """The labels ``y`` (of the first batch ``x``, or every label of arrays): numbers, finite,
    and, for ``classes``, class indices within the model's output width or one-hot rows of that
    width.

    Returns:
        ``"sparse"``, ``"one-hot"``, or None where the classes are not checked.
    """
    if isinstance(y, (dict, list, tuple)):
        return None
    y = _array(y)
    if not _numeric(y.dtype):
        raise _refuse(argument, f"has labels of dtype {y.dtype}; give numbers: "
                                "class indices (integers) or one-hot rows.")
    _check_finite(y, argument, "labels", where)
    shape = _output_shape(model, x, argument) if classes else None
    if shape is None or shape[-1] is None or shape[-1] < 2:
        return None
    width = shape[-1]
    if y.ndim == len(shape) and y.shape[-1] == width:
        if np.any(y < 0):
            raise _refuse(argument, f"has one-hot labels with negative entries (width {width}).")
        return "one-hot"
    if y.ndim == len(shape) - 1 or (y.ndim == len(shape) and y.shape[-1] == 1):
        if np.any(y != np.round(y)) or np.any(y < 0) or np.any(y >= width):
            bad = y[(y != np.round(y)) | (y < 0) | (y >= width)].ravel()[0]
            raise _refuse(argument, f"has label {bad.item()!r}; {_name(model)} has {width} "
                                    f"outputs, so labels are class indices 0 to {width - 1} "
                                    f"(integers) or one-hot rows of width {width}.")
        return "sparse"
    raise _refuse(argument, f"has labels of shape {tuple(y.shape)} for outputs of shape {shape} "
                            f"of {_name(model)}: give class indices (shape {shape[:-1]}) or "
                            f"one-hot rows of width {width}.")
