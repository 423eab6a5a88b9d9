"""Which weights can be pruned, density checks and score-to-mask thresholding.

Every pruner in ``keras_precrop.pai`` scores the same set of weights (see
:func:`prunable_weights`) and turns scores into masks with :func:`masks_from_scores`,
so they all keep exactly the same number of weights for a given density.
"""

import keras
import numpy as np

from keras_precrop.graph import handlers, trace


def weight_specs(layer):
    """Returns ``{variable name: WeightSpec}`` of every maskable weight of ``layer``.

    The layer's handler (``keras_precrop.handlers``) names them: kernels and
    biases of conv/dense layers and BN gamma/beta for the built-in layers; an
    empty dict for a layer without maskable weights or without a handler.
    """
    handler = handlers.handler_of(layer)
    return {} if handler is None else handler.specs_of(layer)


def iter_layers(model):
    """Yields the layers of ``model`` in layer order, descending into nested models.

    A subclassed model or composite layer is read through its trace (the
    traced graph shares the model's layers, so masks reach the model itself).
    """
    for layer in trace.traced(model).functional.layers:
        if isinstance(layer, keras.Model):
            yield from iter_layers(layer)
        else:
            yield layer


def named_weights(model):
    """Returns ``{variable path: (layer, variable, spec)}`` of all maskable weights.

    Raises:
        ValueError: if the model is not built or two weights share a path
            (possible with nested models reusing layer names).
    """
    if not model.built:
        raise ValueError(
            f"Model {model.name!r} is not built; call it on an input or give it "
            "a keras.Input before pruning."
        )
    out = {}
    for layer in iter_layers(model):
        specs = weight_specs(layer)
        for var in layer.weights:
            if var.name not in specs:
                continue
            if var.path in out:
                raise ValueError(
                    f"Two weights of model {model.name!r} share the path "
                    f"{var.path!r}; give the layers of nested models unique names."
                )
            out[var.path] = (layer, var, specs[var.name])
    return out


def prunable_weights(model, include_bias=False, include_batchnorm=False):
    """Returns the weights the pruners score, as ``{path: keras.Variable}``.

    By default these are the kernels of Dense, Conv1D/2D/3D, their transposes,
    DepthwiseConv1D/2D and SeparableConv1D/2D (both kernels), as in the
    Synaptic-Flow reference, which prunes conv and linear weights but not
    biases or BatchNorm. Paths are ``keras.Variable.path`` (e.g.
    ``"stem_conv/kernel"``) in the model's layer order.

    Args:
        model: a built Keras model.
        include_bias: also prune the biases of those layers.
        include_batchnorm: also prune BatchNormalization gamma and beta.

    Raises:
        ValueError: if the model has no prunable weight.
    """
    out = {}
    for path, (layer, var, spec) in named_weights(model).items():
        if not var.trainable:
            continue
        if not any(s.kind in ("kernel", "depthwise") for s in weight_specs(layer).values()):
            if include_batchnorm:  # BN gamma/beta: per-channel weights of a layer without kernel
                out[path] = var
        elif spec.kind == "bias":
            if include_bias:
                out[path] = var
        else:
            out[path] = var
    if not out:
        raise ValueError(
            f"Model {model.name!r} has no prunable weight (Dense, Conv*, "
            "DepthwiseConv*, SeparableConv* kernels)."
        )
    return out


def check_density(density, name="density"):
    """Returns ``density`` as a float after checking it lies in (0, 1].

    Raises:
        ValueError: for NaN, non-numbers and values outside (0, 1].
    """
    try:
        value = float(density)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1], got {density!r}.") from None
    if not 0.0 < value <= 1.0:  # also rejects NaN
        raise ValueError(
            f"{name} must be in (0, 1] (the fraction of weights kept), got {density!r}."
        )
    return value


def num_kept(density, total, where):
    """Number of weights kept out of ``total`` at ``density``: ``round(density * total)``.

    Raises:
        ValueError: if that rounds to zero, which would disconnect the network.
    """
    keep = int(round(density * total))
    if keep < 1:
        raise ValueError(
            f"density {density!r} keeps no weight of the {total} in {where}; "
            f"use a density of at least {0.5 / total:.3g}."
        )
    return keep


def top_k(flat, k):
    """Boolean array keeping the ``k`` largest entries of ``flat``.

    Ties at the threshold go to the lower indices, so the choice is
    deterministic and exactly ``min(k, flat.size)`` entries are kept.
    """
    if k >= flat.size:
        return np.ones(flat.size, bool)
    threshold = np.partition(flat, flat.size - k)[flat.size - k]
    keep = flat > threshold
    ties = np.flatnonzero(flat == threshold)
    keep[ties[: k - int(np.count_nonzero(keep))]] = True
    return keep


def check_scope(scope):
    """Raises ValueError unless ``scope`` is ``"global"`` or ``"local"``."""
    if scope not in ("global", "local"):
        raise ValueError(f"scope must be 'global' or 'local', got {scope!r}.")


def masks_from_scores(scores, density, scope="global"):
    """Keeps the highest-scoring weights, exactly ``round(density * n)`` of them.

    Ties at the threshold are broken deterministically: the weight that comes
    first (model layer order, then C order within a weight) is kept. The
    reference (``torch.kthvalue`` then ``score <= threshold``) instead prunes
    every tied weight and may keep fewer weights than asked; breaking ties by
    position keeps the count exact.

    Args:
        scores: ``{path: array}``, larger is more important.
        density: fraction of weights kept, in (0, 1].
        scope: ``"global"`` (one threshold over all weights, the reference's
            default) or ``"local"`` (each weight keeps ``density`` of itself).

    Returns:
        ``{path: float32 0/1 array}`` with the shapes of ``scores``.

    Raises:
        ValueError: for a bad density or scope, or NaN scores.
    """
    density = check_density(density)
    check_scope(scope)
    flats = {}
    for path, score in scores.items():
        flat = np.asarray(score, dtype=np.float64).ravel()
        if np.isnan(flat).any():
            raise ValueError(
                f"Scores of {path!r} contain NaN; check the model's weights and "
                "the data for NaN/Inf."
            )
        flats[path] = flat
    if scope == "global":
        flat = np.concatenate(list(flats.values()))
        keep = top_k(flat, num_kept(density, flat.size, "the prunable weights"))
        keeps = np.split(keep, np.cumsum([f.size for f in flats.values()])[:-1])
    else:
        keeps = [top_k(f, num_kept(density, f.size, repr(p))) for p, f in flats.items()]
    return {
        path: keep.reshape(np.shape(scores[path])).astype(np.float32)
        for path, keep in zip(flats, keeps)
    }


def density_schedule(density, iterations, schedule):
    """Densities of rounds ``1..iterations`` of iterative pruning.

    ``"exponential"``: ``density ** (k / iterations)``; ``"linear"``:
    ``1 - (1 - density) * k / iterations`` (the reference's two schedules).
    """
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"iterations must be a positive int, got {iterations!r}.")
    steps = np.arange(1, iterations + 1) / iterations
    if schedule == "exponential":
        return [density**s for s in steps]
    if schedule == "linear":
        return [1.0 - (1.0 - density) * s for s in steps]
    raise ValueError(f"schedule must be 'exponential' or 'linear', got {schedule!r}.")


def spread(spec, matrix, ndim):
    """Reshapes an ``(in, out)`` channel matrix to broadcast against a kernel.

    ``matrix[i, o]`` applies to every weight joining input channel ``i`` to
    output channel ``o`` (for a depthwise kernel: channel ``i``, multiplier
    ``o``) of a rank-``ndim`` kernel laid out as ``spec`` says.
    """
    in_axis, out_axis = spec.in_axis % ndim, spec.out_axis % ndim
    shape = [1] * ndim
    shape[in_axis], shape[out_axis] = matrix.shape
    return (matrix.T if in_axis > out_axis else matrix).reshape(shape)
