"""Activation magnitudes on the batches of ``data=``: what ``importance="activation"`` ranks by.

NVIDIA's Minitron (ModelOpt's pruning) ranks an MLP's neurons by the
magnitude of its intermediate activations, attention heads by the magnitude
of each head's output and the embedding (residual stream) channels by the
magnitude of the LayerNormalizations' outputs, over a calibration set. The
same magnitude ranks here every channel the walk can cut, in the per-layer
shares of ``importance.py``: each layer whose trainable weights have a
channel axis scores the channels along it by

* an axis that writes channels (``"out"``: a kernel's filters, a bias, a
  normalization's scale and offset): the layer's first output on each
  channel (its last axis), after the layer's own activation function;
* an axis that reads an input's channels (``"in"``, ``"in:<i>"``, and the
  grouped, depthwise and separable kinds of it): that input on each channel;
* an attention layer's units (``"unit"``/``"unit_in"``: heads, or the
  per-head dimensions under ``attention="head_dims"``): the attention
  context, the input of its output projection (each head's output), on
  each unit.

The magnitude of a channel is the mean of ``|value|`` over a batch's
samples and every position (tokens, pixels): one row of means per batch,
which the shares sum (batches of one size: the mean over all the data).
Minitron aggregates by the mean over tokens and the L2 norm over batches;
the two rank alike unless a channel's magnitude varies much between
batches. A channel that never activates (a ReLU neuron below zero on every
example) scores 0 however large its weights.

They are read from one forward pass per batch of the model itself, in
inference mode, during which each layer observed is lent a call that notes
the magnitudes of its first call's inputs and output; the layers' own calls
are back after the pass, and only the magnitudes are kept.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
from keras import ops

from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph.channels import input_shape
from keras_precrop.training.constraints import give_back_call, lend_call
from keras_precrop.transfer import flow


def source(role):
    """What a weight axis of ``role`` is scored by: ``"out"``, ``"in:<i>"`` or ``"unit"``."""
    role = flow.unit_block(role)[0]
    if role == "out":
        return "out"
    if role in ("unit", "unit_in"):
        return "unit"
    return role if role.startswith("in:") else "in:0"


def layer_magnitudes(graph, model, batches, scored):
    """The activation magnitudes of the layers ``scored`` on each batch, from ``model``'s forward pass.

    Args:
        graph: the walk of ``model``, or of its copy at a defined input
            size (the same layers, in the same order).
        model: the model the batches fit.
        batches: the ``(x, y)`` batches (``y`` is not read).
        scored: ``[(call, roles)]``: each scored layer's first call in
            ``graph`` and the roles of its weights' channel axes.

    Returns:
        ``{id(layer of graph): {source: array (batches, channels)}}``, a
        source as :func:`source` names it.

    Raises:
        UnsupportedLayerError: a layer the forward pass does not call as
            the walk did (naming it, with the ``ignore=`` remedy).
    """
    find = run_layers(graph.model, model)
    wanted = {}  # id(run layer) -> (run layer, [(key, input index or None, kept axis)])
    for call, roles in scored:
        for key, layer, index, axis in _reads(call, roles):
            run = find(layer, call)
            wanted.setdefault(id(run), (run, []))[1].append(((id(call.record.layer), key), index, axis))
    rows = {key: [] for _, reads in wanted.values() for key, _, _ in reads}
    for x, _ in batches:
        noted = {}
        with _lent(wanted, noted):
            model(x, training=False)
        for (walked, key), row in rows.items():
            if (walked, key) not in noted:
                raise _unobserved(next(c for c, _ in scored if id(c.record.layer) == walked))
            row.append(noted[(walked, key)])
    out = {}
    for (walked, key), row in rows.items():
        out.setdefault(walked, {})[key] = np.stack(row)
    return out


def _reads(call, roles):
    """``(source, layer, input index or None for the output, kept axis)`` of each source of a call.

    A unit is read from the output projection, the sublayer that holds
    the ``"unit_in"`` weight: its input along the axis that weight's unit
    axis contracts (its kernel's leading axes contract the input's last ones).
    """
    rec, found = call.record, {}
    for w, axes in roles:
        for axis, role in axes.items():
            key = source(role)
            if key == "out":
                found[key] = (rec.layer, None, -1)
            elif key != "unit":
                found[key] = (rec.layer, int(key[3:]), -1)
            elif flow.unit_block(role)[0] == "unit_in":
                axis = axis % len(w.shape)
                found[key] = (_owner(rec.layer, w), 0, axis - len(w.shape) + 1)
    if any(source(role) == "unit" for _, axes in roles for role in axes.values()) and "unit" not in found:
        raise UnsupportedLayerError(
            f"{rec.path}: importance='activation' reads an attention layer's units from the input "
            "of the sublayer that reads them, but no weight of this layer reads them. Rank with "
            "another importance, or keep the layer whole with {ignore}.", ignore=[rec.path])
    return [(key, *value) for key, value in found.items()]


def _owner(layer, weight):
    """The sublayer of ``layer`` (or ``layer``) that holds ``weight`` itself, not through another."""
    for sub in layer._flatten_layers(include_self=True, recursive=True):
        if any(v is weight for v in sub._trainable_variables + sub._non_trainable_variables):
            return sub
    return layer  # pragma: no cover - a weight is held by some layer


def run_layers(walked, model, reader="importance='activation'", remedy="Rank with another importance"):
    """``find(layer, call)``: the layer of ``model`` that a layer of the walk of ``walked`` is.

    ``walked`` is ``model`` or calls its layers (``GradualPruning``'s walk at
    a defined size), or is a copy of it (``apply_plan``'s for a model built
    for any input size), whose layers pair with ``model``'s in Keras' order.
    ``reader`` and ``remedy`` word the error for a layer that cannot be
    paired: what reads the forward pass, and what else the user may do.
    """
    own = list(model._flatten_layers(include_self=True, recursive=True))
    known = {id(layer) for layer in own}
    copies = list(walked._flatten_layers(include_self=True, recursive=True))
    paired = {id(c): o for c, o in zip(copies, own) if type(c) is type(o)} \
        if len(copies) == len(own) else {}

    def find(layer, call):
        run = layer if id(layer) in known else paired.get(id(layer))
        if run is None or [w.shape for w in run.weights] != [w.shape for w in layer.weights]:
            raise _unobserved(call, reader, remedy)
        return run

    return find


def _unobserved(call, reader="importance='activation'", remedy="Rank with another importance"):
    """The error for a layer whose activations the forward pass does not show as the walk saw it."""
    return UnsupportedLayerError(
        f"{call.record.path}: {reader} reads each layer's activations from a forward pass of the "
        "model, which does not call this layer as the walk did (input shape "
        f"{input_shape(call.node)}). {remedy}, or keep the layer whole with {{ignore}}.",
        ignore=[call.record.path])


@contextlib.contextmanager
def _lent(wanted, noted):
    """Lend each wanted layer a call that notes its first call's magnitudes in ``noted``."""
    lent = []  # (layer, the call lent, its own call attribute before)
    try:
        for layer, reads in wanted.values():
            call = _noting(layer.call, reads, noted)
            lent.append((layer, call, lend_call(layer, call)))
        yield
    finally:
        for layer, call, own in lent:
            give_back_call(layer, call, own)


def _noting(call, reads, noted):
    """``call``, noting on its first call the mean magnitude of each input or output ``reads`` names."""

    def lent(*args, **kwargs):
        outputs = call(*args, **kwargs)
        if reads[0][0] not in noted:
            tensors = [v for v in keras.tree.flatten((list(args), kwargs)) if ops.is_tensor(v)]
            first = keras.tree.flatten(outputs)[0]
            for key, index, axis in reads:
                if index is None or index < len(tensors):  # else unobserved: refused after the pass
                    noted[key] = _mean_magnitude(first if index is None else tensors[index], axis)
        return outputs

    return lent


def _mean_magnitude(tensor, axis):
    """The mean of ``|tensor|`` over every axis but ``axis``: one float64 per index along it."""
    tensor = ops.abs(ops.cast(tensor, "float32"))
    axis = axis % len(tensor.shape)
    others = tuple(a for a in range(len(tensor.shape)) if a != axis)
    return np.asarray(ops.convert_to_numpy(ops.mean(tensor, axis=others)), np.float64)
