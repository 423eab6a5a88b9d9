"""Applying masks so pruned weights stay zero through training and save/load.

A mask is attached to its weight as a :class:`MaskConstraint`. Keras 3
optimizers apply ``variable.constraint`` right after every update (after
momentum and weight decay, on every backend, under ``tf.distribute``
strategies and Keras' JAX distribution alike), so a masked weight is exactly
zero after every step without any callback. The
constraint is also stored in the layer attribute that ``get_config``
serializes (``kernel_constraint``, ``depthwise_constraint``, ...), so a model
saved as ``.keras`` reloads with its masks (``import keras_precrop`` registers
``MaskConstraint``, defined in ``keras_precrop.constraints``).
"""

import numpy as np

from keras_precrop.pai import common
from keras_precrop.training.constraints import MaskConstraint, distribution_scope


def check_masks(model, masks):
    """Validates ``masks`` against ``model``'s weights and returns them as float32.

    Args:
        model: the built model the masks belong to.
        masks: ``{weight path: 0/1 array}``.

    Returns:
        ``{path: (layer, variable, spec, float32 mask)}`` in model order.

    Raises:
        ValueError: for an unknown weight name, a shape mismatch, or values
            other than 0 and 1 (including NaN).
    """
    if not isinstance(masks, dict) or not masks:
        raise ValueError(
            f"masks must be a non-empty dict {{weight path: 0/1 array}}, got {type(masks).__name__}.")
    weights = common.named_weights(model)
    unknown = [p for p in masks if p not in weights]
    if unknown:
        raise ValueError(
            f"masks name weights that model {model.name!r} has no maskable weight "
            f"for: {unknown[:5]}; valid names look like {list(weights)[:3]} "
            "(see keras_precrop.pai.prunable_weights(model))."
        )
    out = {}
    for path, (layer, var, spec) in weights.items():
        if path not in masks:
            continue
        mask = np.asarray(masks[path])
        if tuple(mask.shape) != tuple(var.shape):
            raise ValueError(
                f"Mask for {path!r} has shape {tuple(mask.shape)} but the weight "
                f"has shape {tuple(var.shape)}."
            )
        mask = mask.astype(np.float32)
        if not np.all((mask == 0) | (mask == 1)):
            bad = mask[(mask != 0) & (mask != 1)].ravel()[0]
            raise ValueError(
                f"Mask for {path!r} must contain only 0 and 1, found {bad!r}."
            )
        out[path] = (layer, var, spec, mask)
    return out


def apply_masks(model, masks):
    """Zeroes the masked weights of ``model`` and keeps them zero from then on.

    The model is modified in place and returned. Each mask becomes a
    :class:`MaskConstraint` on its weight (wrapping any constraint the weight
    already had), so ``model.fit`` with any Keras optimizer (momentum, weight
    decay) on every backend and under a distribution, keeps pruned weights at
    exactly zero, and ``.keras`` save/load keeps the masks. A compiled model's
    cached train function is dropped so the next ``fit`` traces the
    constraints in. Not covered: optimizers with ``use_ema=True``, which
    average the weights before constraints apply and copy the average back.

    Args:
        model: a built Keras model.
        masks: ``{weight path: 0/1 array}``, e.g. from :func:`synflow`.

    Returns:
        ``model``.

    Raises:
        ValueError: see :func:`check_masks`.
    """
    for layer, var, spec, mask in check_masks(model, masks).values():
        inner = getattr(layer, spec.constraint_attr, None)
        if isinstance(inner, MaskConstraint):
            inner = inner.inner
        with distribution_scope(var):
            constraint = MaskConstraint(mask, inner=inner)
        setattr(layer, spec.constraint_attr, constraint)
        var.constraint = constraint
        var.assign(var.numpy() * mask.astype(var.dtype))
    if getattr(model, "train_function", None) is not None:
        model.train_function = None
    return model


def layer_densities(masks):
    """Returns ``{weight path: fraction of ones}`` of each mask."""
    return {path: float(np.count_nonzero(m)) / max(np.size(m), 1) for path, m in masks.items()}


def sparsity_report(masks, model=None):
    """A ``model.summary()``-style text table of kept/total weights per mask.

    Args:
        masks: ``{weight path: 0/1 array}``.
        model: optional; when given, a last line also counts every parameter
            of the model (unmasked ones included), as ``count_params`` does.

    Returns:
        The table as a string (print it).
    """
    rows = []
    kept_total = size_total = 0
    for path, m in masks.items():
        kept, size = int(np.count_nonzero(m)), int(np.size(m))
        kept_total += kept
        size_total += size
        shape = "x".join(str(d) for d in np.shape(m))
        rows.append((path, shape, f"{kept:,}", f"{size:,}", f"{kept / size:.4f}"))
    header = ("Weight", "Shape", "Kept", "Total", "Density")
    footer = [("Total (masked weights)", "", f"{kept_total:,}", f"{size_total:,}",
               f"{kept_total / max(size_total, 1):.4f}")]
    if model is not None:
        n_params = model.count_params()
        pruned = size_total - kept_total
        footer.append(
            ("Total (all parameters)", "", f"{n_params - pruned:,}", f"{n_params:,}",
             f"{(n_params - pruned) / n_params:.4f}")
        )
    widths = [max(len(r[i]) for r in [header, *rows, *footer]) for i in range(5)]

    def line(r):
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        )

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, rows), rule, *map(line, footer)])
