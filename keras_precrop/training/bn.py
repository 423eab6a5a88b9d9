"""Re-estimating batch-normalization statistics, e.g. of a model pruned with kept weights.

A trained model pruned with ``weights="keep"`` keeps each kept channel's
normalization statistics, but the inputs of its BatchNormalization layers
are no longer what those statistics describe: every layer before them lost
channels. :func:`recalibrate_bn` measures them again on a few batches of
training data, without training: no optimizer, no gradient, no weight other
than the moving means and variances changes.

How: each BatchNormalization layer runs once per batch in training mode with
momentum 0, so that after the batch its moving statistics are that batch's
mean and (biased) variance, as ``ops.moments`` computes them on every
backend; they are read after each batch and pooled in float64 (the mean and
variance of all the examples seen, batches weighted by their rows). The
momenta, ``trainable`` flags and every other variable are set back after,
and only then are the pooled statistics written. The model runs eagerly
(momentum is a Python number read at call time).
"""

from __future__ import annotations

import itertools

import keras
import numpy as np

from keras_precrop.errors import NAME_ONLY, ArgumentError
from keras_precrop.training._user_data import _split_batch, array_batches, check_data, is_array, is_pair
from keras_precrop.training.finetune import _check_count, _restore_flags, _trainable_flags


def recalibrate_bn(model, data, batches=30, *, batch_size=None):
    """Re-estimates the moving mean and variance of every BatchNormalization layer of ``model``.

    Use it after pruning a trained model with kept weights and before
    evaluating it: the kept statistics describe the unpruned model's
    activations, which is why such a model can score near chance until it
    is trained (measured on CIFAR-10 ResNet-20s:
    ``experiments/results/recalibrate_bn.md``).

    ``model`` is changed in place, and only there: the moving statistics of
    its BatchNormalization layers, nested models' included, frozen
    (``trainable=False``) ones too. Nothing trains and nothing else changes:
    the other weights and variables, each layer's ``trainable`` flag and
    momentum are as before. The statistics are those of the layers' inputs
    with the model run in training mode (each normalization layer using its
    batch's statistics, as in training; other layers with a training mode,
    such as ``Dropout``, are active as well, as in PyTorch's
    ``torch.optim.swa_utils.update_bn``), pooled over every example of the
    batches read: the mean, and the variance about it. A layer called more
    than once per forward pass keeps the statistics of its last call.

    Args:
        model: a Keras model with at least one BatchNormalization layer
            (batch renormalization, ``renorm=True``, is not supported).
        data: inputs to measure on, preprocessed as the model was trained
            (its augmentation included: on un-augmented training images
            the unpruned CIFAR-10 teachers' recalibrated statistics cost
            them 3 points, 81.8 -> 78.1, in the table above): an ``(x, y)`` pair or an array ``x`` (cut into
            batches of ``batch_size``), a ``tf.data.Dataset`` or
            ``keras.utils.PyDataset`` of batches (``(x, y)`` or ``x``), or
            any iterable of batches. Labels are not used. Its first batch is
            checked against ``model`` (shape, dtype, finite values).
        batches: the most batches to read (fewer where ``data`` has fewer);
            a positive integer.
        batch_size: rows per batch of array ``data`` (default 32); batched
            data keeps its own.

    Returns:
        ``model`` itself, recalibrated.

    Raises:
        ArgumentError: naming ``model=`` (not a Keras model, no
            BatchNormalization layer, a renormalizing one), ``batches=``
            or ``batch_size=``; ``DataError`` naming ``data=`` for data that
            does not fit ``model``.
    """
    layers = _batch_norms(model)
    _check_count("batches", batches)
    if batches is None:  # a bound is needed here: None is no count
        raise ArgumentError("{batches:subject} must be a positive integer{got}", batches=batches)
    _check_count("batch_size", batch_size)
    checked = check_data(model, data, "data", labels=False, classes=False,
                         bound=("batches", batches), batch_size=batch_size)
    saved = [(v, keras.ops.convert_to_numpy(v)) for v in model.variables if not v.trainable]
    flags = [flag for layer in layers for flag in _trainable_flags(layer)]
    momenta = [layer.momentum for layer in layers]
    try:
        for layer in layers:
            layer.trainable, layer.momentum = True, 0.0
        statistics = _pooled_statistics(
            model, layers, _input_batches(checked.data, batches, batch_size or 32))
    finally:
        for variable, value in saved:
            variable.assign(value)
        _restore_flags(flags)
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    for layer, (mean, variance) in zip(layers, statistics):
        layer.moving_mean.assign(mean.astype(keras.backend.standardize_dtype(layer.moving_mean.dtype)))
        layer.moving_variance.assign(
            variance.astype(keras.backend.standardize_dtype(layer.moving_variance.dtype)))
    return model


def _batch_norms(model):
    """``model``'s BatchNormalization layers (nested ones included); refuses a model without."""
    if not isinstance(model, keras.Model):
        raise ArgumentError("{model:subject} must be a keras.Model with BatchNormalization "
                            "layers{got}.", model=model)
    layers = [layer for layer in model._flatten_layers(include_self=False, recursive=True)
              if isinstance(layer, keras.layers.BatchNormalization)]
    if not layers:
        raise ArgumentError(f"{{model:=}} ({model.name!r}) has no BatchNormalization layer, so "
                            "there are no statistics to re-estimate.", model=NAME_ONLY)
    renorm = [layer.name for layer in layers if getattr(layer, "renorm", False)]
    if renorm:
        raise ArgumentError(f"{{model:=}} ({model.name!r}) has batch renormalization "
                            f"(renorm=True) in {renorm}, whose statistics recalibrate_bn does not "
                            "re-estimate.", model=NAME_ONLY)
    return layers


def _input_batches(data, batches, batch_size):
    """The inputs of at most ``batches`` batches of ``data`` (checked), as numpy arrays."""
    if is_pair(data) or is_array(data):  # arrays
        x = data[0] if is_pair(data) else data
        for batch in array_batches(x, batch_size, limit=batches * batch_size):
            yield keras.tree.map_structure(np.asarray, batch)
        return
    for batch in itertools.islice(iter(data), batches):
        yield keras.tree.map_structure(np.asarray, _split_batch(batch, "data", labels=False)[0])


def _pooled_statistics(model, layers, batches):
    """``[(mean, variance)]`` of each layer's inputs over every example of ``batches``.

    Each layer must be set to update its moving statistics with momentum 0,
    so that after a batch they are that batch's mean and variance.
    """
    seen = [[] for _ in layers]
    for x in batches:
        model(x, training=True)
        rows = len(keras.tree.flatten(x)[0])
        for found, layer in zip(seen, layers):
            found.append((rows, keras.ops.convert_to_numpy(layer.moving_mean),
                          keras.ops.convert_to_numpy(layer.moving_variance)))
    return [_pool(found) for found in seen]


def _pool(found):
    """The mean and variance of all examples from ``[(rows, batch mean, batch variance)]``."""
    rows = np.array([n for n, _, _ in found], dtype=np.float64)
    means = np.stack([m for _, m, _ in found]).astype(np.float64)
    variances = np.stack([v for _, _, v in found]).astype(np.float64)
    weights = (rows / rows.sum()).reshape((-1,) + (1,) * (means.ndim - 1))
    mean = (weights * means).sum(0)
    return mean, (weights * (variances + (means - mean) ** 2)).sum(0)
