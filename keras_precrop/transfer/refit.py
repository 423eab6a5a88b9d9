"""Refitting a pruned model's linear projections by least squares: ``refit=True``.

A cut with kept weights leaves each linear projection reading fewer
channels than it was trained on, from layers that changed too; until
training moves them, the errors add up block by block (the CIFAR-10 ViT
teacher, 67% on the test set, scores 14% cut to 28% of its MACs). ``refit=True`` then
solves, projection by projection in the order the model calls them,

    min_{W, b}  || X_new W + b - (X_old K_old + b_old)[kept outputs] ||^2

over the batches of ``data=``: ``X_new`` is the projection's input in the
pruned model (with the projections before it refit already), ``X_old`` its
input in the original model, ``K_old``, ``b_old`` the original's weights,
and the kept outputs those the cut kept of them. So each projection
computes, on the calibration data, as near as a linear map can to what the
original's did: channel pruning's reconstruction step (He et al., ICCV
2017, for convolutions), and FLAP's bias compensation (AAAI 2024) when only
``b`` moves. Where the data determine it, the solution does not depend on
the weights carried, only on which channels the ranking kept; what they
leave free (an input that never varies) keeps the carried weights, as the
normal equations' ridge pulls toward them. A projection the data give fewer
than :data:`ROWS_PER_UNKNOWN` rows per unknown keeps its carried weights
whole (a :class:`RefitWarning` names it): so few rows fit the calibration
batches, not the model.

Projections are the layers whose kernel contracts the input's last axes:
``Dense``, ``EinsumDense`` of such an equation, and the ``EinsumDense``
sublayers of an attention layer (query, key, value and output). Other
layers (convolutions, normalizations, embeddings), frozen ones
(``trainable=False``) and those with a weight constraint keep their carried
weights. A layer called more than once (shared weights) is not refit, as
one solution cannot fit its calls at once.

Cost: each projection runs the original and the pruned model once per
batch, up to itself, and solves one system of its input width (plus one) unknowns.
"""

from __future__ import annotations

import functools
import math
import warnings

import keras
import numpy as np

from keras_precrop.progress import progbar
from keras_precrop.training.constraints import give_back_call, lend_call
from keras_precrop.transfer.activation import run_layers
from keras_precrop.transfer.carry import carried_indices

# Rows (examples x positions) a least-squares fit needs per unknown: with fewer it fits the
# calibration batches and loses on other inputs (an MLP cut to half its parameters fell below the
# plain cut on held-out data at 2 rows per unknown and rose above it from 3).
ROWS_PER_UNKNOWN = 4


class RefitWarning(UserWarning):
    """``refit=True`` left projections as carried: ``data=`` has too few rows to fit them."""


# The ridge toward the carried weights, as a share of the normal equations' mean diagonal: it
# keeps a system with a channel that never varies (a dead neuron) solvable, at its carried weights,
# and moves an exact fit by < 1e-6.
_RIDGE = 1e-7


def projections(graph, new_graph):
    """The projections a refit solves for, in call order: ``[(call, old sublayer, new sublayer)]``.

    Args:
        graph, new_graph: the walks of the original and the pruned model;
            ``call`` is the original's layer's (only) call in ``graph``.
    """
    paths = [c.record.path for c in graph.calls]
    new_layers = {rec.path: rec.layer for rec in new_graph.layers}
    found = []
    for call in graph.calls:
        new = new_layers.get(call.record.path)
        if not isinstance(new, keras.layers.Layer) or paths.count(call.record.path) != 1:
            continue  # an operation (x + y) has no weights
        olds = list(call.record.layer._flatten_layers(include_self=True, recursive=True))
        news = list(new._flatten_layers(include_self=True, recursive=True))
        if len(olds) == len(news):
            found += [(call, o, n) for o, n in zip(olds, news)
                      if _contracted(o) and _contracted(n) and _free(o)]
    return found


def _free(layer):
    """Whether a refit may move ``layer``'s weights: not frozen (``trainable=False``, which the
    user set so they stay) and without a weight constraint (a least-squares solution need not
    meet one)."""
    constrained = (getattr(layer, "kernel_constraint", None) is not None
                   or getattr(layer, "bias_constraint", None) is not None)
    return layer.trainable and not constrained


def _contracted(layer):
    """How many trailing input axes ``layer``'s kernel contracts (its leading ones), or 0.

    ``Dense`` contracts one; an ``EinsumDense`` whose equation reads
    ``<batch><contracted>,<contracted><out>-><batch><out>`` (every attention
    projection's) contracts its ``<contracted>``. Any other layer: 0.
    """
    kernel = getattr(layer, "_kernel", None)
    if kernel is None or getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode",
                                                                            None):
        return 0
    bias = getattr(layer, "bias", None)
    if type(layer) is keras.layers.Dense:
        k = 1
    elif type(layer) is keras.layers.EinsumDense:
        k = _einsum_contracted(layer.equation)
    else:
        return 0
    if bias is not None and tuple(bias.shape) != tuple(kernel.shape[k:]):
        return 0  # a bias over some output axes only cannot take a per-output solution
    return k


def _einsum_contracted(equation):
    """The contracted axes' count of an ``EinsumDense`` equation of the projection form, else 0."""
    inputs, out = equation.replace(" ", "").replace("...", "*").split("->")
    x, kernel = inputs.split(",")
    shared = [c for c in kernel if c in x and c not in out]
    k = len(shared)
    if not k or "*" in kernel:  # (Keras takes letters and "..." only)
        return 0
    batch, rest = x[:len(x) - k], x[len(x) - k:]
    if rest != "".join(shared) or kernel[:k] != rest or out != batch + kernel[k:]:
        return 0
    return k


def refit_projections(graph, new_graph, widths, selection, model, new_model, batches, verbose=1):
    """Refit every projection of ``new_model`` by least squares, in call order (see the module).

    Args:
        graph, new_graph: the walks of the original and the pruned model
            (of their copies at a defined input size, or of the models).
        widths: the pruned model's width of every variable of ``graph``.
        selection: the original channel of each kept channel, per variable
            (what :func:`~keras_precrop.transfer.carry.carry_weights` returned).
        model: the original model the batches fit; not changed (each layer
            read is lent a noting call for one forward pass, then given its own back).
        new_model: the pruned model the batches fit; its projections' kernels
            and biases are overwritten.
        batches: the inputs ``x`` of the calibration batches.
        verbose: 1: a line, then a progress bar (plain lines off a terminal), 2: a line at
            the end, 0: silent.

    Returns:
        The paths of the layers whose projections were refit, in order; those
        ``batches`` have fewer than :data:`ROWS_PER_UNKNOWN` rows per unknown for
        keep their carried weights, named in a :class:`RefitWarning`.
    """
    find_old, find_new = (run_layers(walked, run, "refit=True", "Leave refit=True out")
                          for walked, run in ((graph.model, model), (new_graph.model, new_model)))
    pairs = projections(graph, new_graph)
    columns = _kept_columns(graph, new_graph, widths, selection, pairs)
    new_layers = {rec.path: rec.layer for rec in new_graph.layers}
    items = [(call.record.path, find_old(old, call), find_new(new, call), _contracted(old),
              functools.partial(_target_weights, call.record, new_layers[call.record.path], old,
                                new, _contracted(old), columns[id(new._kernel)]))
             for call, old, new in pairs]  # (the targets read one projection at a time)
    return _refit(items, model, new_model, batches, "projections", verbose)


def refit_head(model, new_model, layers, batches, verbose=1):
    """Refit ``new_model``'s projections among ``layers`` to what ``model``'s computed.

    For layers after a cut whose outputs it kept whole: a keras_hub task's
    head over its pruned backbone, so each new projection is fit to its
    original's whole outputs from its own inputs, which may be fewer (a
    CNN backbone's pruned features).

    Args:
        model, new_model: the original and the pruned model ``batches`` fit.
        layers: ``(original layer, new layer)`` pairs, one layer of each
            model, in call order; those that are no projection, or frozen
            or constrained, keep their weights.
        batches: the inputs ``x`` of the calibration batches.
        verbose: as for :func:`refit_projections`.

    Returns:
        The paths of the layers refit, as :func:`refit_projections` does.
    """
    items = []
    for old, new in layers:
        k = _contracted(old)
        if k and _contracted(new) == k and _free(old):
            items.append((new.path, old, new, k, functools.partial(_whole_weights, old, k)))
    return _refit(items, model, new_model, batches, "projections of the head", verbose)


def _whole_weights(layer, k):
    """``(kernel, bias)`` of ``layer`` as :func:`_target_weights` gives a cut layer's: every
    output kept."""
    kernel = keras.ops.convert_to_numpy(layer._kernel)
    bias = None if layer.bias is None else keras.ops.convert_to_numpy(layer.bias).ravel()
    return kernel.reshape(math.prod(kernel.shape[:k]), -1), bias


def _refit(items, model, new_model, batches, what, verbose):
    """Solve each of ``items`` (``(path, original layer, new layer, contracted axes, targets)``,
    in call order; ``targets()`` gives the target kernel and bias) on ``batches`` and write it
    into its new layer."""
    if verbose:
        print(f"Refitting {len(items)} {what} by least squares on {len(batches)} batches")
    bar = progbar(len(items), verbose=verbose)
    refit, short = [], []
    for i, (path, old, new, k, targets) in enumerate(items):
        (kernel, bias), gram, cross, rows = targets(), 0, 0, 0
        for x in batches:
            x_old, x_new = _input_of(model, old, x), _input_of(new_model, new, x)
            design = _design(x_new, k, new.bias is not None)
            target = x_old.reshape(len(design), -1) @ kernel
            gram, rows = gram + design.T @ design, rows + len(design)
            cross = cross + design.T @ (target if bias is None else target + bias)
        if rows < ROWS_PER_UNKNOWN * len(gram):  # it would fit the batches, not the model
            short.append((path, rows, len(gram)))
        else:
            _assign(new, _solve(gram, cross, _carried(new, k)), k)
            refit.append(path)
        bar.update(i + 1)
    _warn_short(short, batches)
    return refit


def _warn_short(short, batches):
    """A :class:`RefitWarning` naming the projections ``data=`` has too few rows to refit
    (``short``: their paths, rows and unknowns), with how many examples would do."""
    if not short:
        return
    examples = sum(len(keras.tree.flatten(x)[0]) for x in batches)
    said = ", ".join(
        f"{path!r} ({rows:,} rows for {unknowns:,} unknowns: about "
        f"{math.ceil(ROWS_PER_UNKNOWN * unknowns * examples / rows):,} examples)"
        for path, rows, unknowns in short)
    warnings.warn(
        f"refit=True kept the carried weights of {len(short)} projection(s) that data= "
        f"({examples:,} examples) has too few rows for: {said}. A least-squares fit wants "
        f"{ROWS_PER_UNKNOWN} rows (examples x positions) per unknown (inputs + bias), or it fits the "
        "calibration data and loses elsewhere; pass more examples in data= to refit them.",
        RefitWarning, stacklevel=4)


def _target_weights(rec, new_layer, old, new, k, columns):
    """``(kernel, bias)``: the original projection's weights that compute its kept outputs from
    every input it had, as rows x kept outputs (and kept outputs, or ``None`` for no bias).

    They pass through the handler's :meth:`carried_value` as kept weights do, so that a layer
    that rescales what it keeps (attention's query under fewer dimensions per head) is fit to
    what the carried layer would compute, not to the unscaled original.
    """
    kernel = keras.ops.convert_to_numpy(old._kernel)
    out_shape = tuple(new._kernel.shape[k:])
    full = kernel.reshape(-1, math.prod(kernel.shape[k:]))[:, columns]
    full = rec.handler.carried_value(rec, new_layer, old._kernel,
                                     full.reshape(kernel.shape[:k] + out_shape))
    bias = None
    if old.bias is not None:
        bias = keras.ops.convert_to_numpy(old.bias).ravel()[columns].reshape(out_shape)
        bias = rec.handler.carried_value(rec, new_layer, old.bias, bias).ravel()
    return full.reshape(-1, len(columns)), bias


def _kept_columns(graph, new_graph, widths, selection, pairs):
    """``{id(rebuilt kernel): the original output (flat, over the kernel's output axes) each of
    its outputs is}`` for the projections of ``pairs``, read from the flat indices carried into
    every rebuilt kernel."""
    ks = {id(new._kernel): _contracted(new) for _, _, new in pairs}
    out = {}
    for w, new_w, index in carried_indices(graph, new_graph, widths, selection):
        k = ks.get(id(new_w))
        if k:
            first = index[(0,) * k].astype(np.int64) - 1  # flat indices of the first kept input row
            out[id(new_w)] = (first % math.prod(w.shape[k:])).ravel()
    return out


class _Noted(Exception):  # noqa: N818  (not an error: the end of a pass that has what it needs)
    """Raised by a noting call once it holds its input: the rest of the forward pass is not run."""


def _input_of(model, layer, x):
    """The first input of ``layer``'s first call in ``model(x)``, as float64 NumPy.

    The pass stops there (Keras unwinds each layer's call context as the
    exception passes), so a projection near the input costs a fraction of a
    forward pass: about half of one on average.
    """
    noted = []

    def noting(*args, **kwargs):
        noted.append(keras.ops.convert_to_numpy(args[0]))
        raise _Noted

    own = lend_call(layer, noting)
    try:
        model(x, training=False)
    except _Noted:
        pass
    finally:
        give_back_call(layer, noting, own)
    return noted[0].astype(np.float64)


def _design(x, k, bias):
    """The rows of ``x`` over its ``k`` contracted axes, with a column of ones for a bias."""
    rows = x.reshape(-1, math.prod(x.shape[len(x.shape) - k:]))
    return np.concatenate([rows, np.ones((len(rows), 1))], axis=1) if bias else rows


def _carried(layer, k):
    """``layer``'s weights as a solution's rows (the contracted inputs, then the bias), float64."""
    kernel = keras.ops.convert_to_numpy(layer._kernel).astype(np.float64)
    rows = kernel.reshape(math.prod(kernel.shape[:k]), -1)
    if layer.bias is None:
        return rows
    return np.concatenate([rows, keras.ops.convert_to_numpy(layer.bias).reshape(1, -1)])


def _solve(gram, cross, prior):
    """The least-squares solution of ``gram @ w = cross`` nearest ``prior`` (float64).

    A ridge toward the carried weights ``prior``: where the data do not
    determine the solution (fewer rows than inputs, a channel that never
    varies) it keeps what was carried instead of moving toward zero, so an
    identity plan refit on a single batch still is the original.
    """
    ridge = _RIDGE * max(float(np.mean(np.diag(gram))), 1e-12)
    return np.linalg.solve(gram + ridge * np.eye(len(gram)), cross + ridge * prior)


def _assign(layer, solution, k):
    """Write ``solution`` (rows: the contracted inputs, then the bias) into ``layer``."""
    kernel = layer._kernel
    rows = math.prod(kernel.shape[:k])
    kernel.assign(solution[:rows].reshape(kernel.shape).astype(kernel.dtype))
    if layer.bias is not None:
        layer.bias.assign(solution[rows].reshape(layer.bias.shape).astype(layer.bias.dtype))
