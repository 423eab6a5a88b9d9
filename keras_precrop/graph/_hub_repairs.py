"""Layers whose class cannot re-create itself from its own config: repaired, and checked.

A pruned model is built from its layers' configs, the layers kept whole too
(:mod:`keras_precrop.graph.rebuild`): Keras' contract is that
``type(layer).from_config(layer.get_config())`` re-creates ``layer``.
keras_hub 0.32 breaks it in three classes that ``ignore="auto"`` keeps whole
in its Swin, MiT/SegFormer and DINOv3 backbones (issue 61):

- Swin's ``PatchEmbedding.get_config`` serializes its ``norm_layer``, a
  class, as if it were a layer object (``TypeError``), and its
  ``from_config`` cannot read a class back;
- ``DINOV3Attention.get_config`` writes ``query_bias``, ``key_bias``,
  ``value_bias`` and ``proj_bias``, which its constructor takes as
  ``use_query_bias``... (the unknown keys reach ``Layer.__init__``:
  ``TypeError``);
- ``SegFormerMultiheadAttention.__init__`` takes neither ``name``,
  ``trainable`` nor ``dtype`` (it has no ``**kwargs``), which Keras writes
  into its config.

This module is the one place that knows such repairs: ``_REPAIRS``, a table
of classes (by module and name, so that keras_hub is never imported here),
each with the config it needs written from the layer's attributes and/or the
way it is constructed from its config; and one general fallback, for a
constructor without ``**kwargs`` that refuses only the base arguments
``name``, ``trainable`` and ``dtype``: the layer is constructed without them
and they are set on it afterwards.

A repair is trusted only once checked (:func:`difference`): a twin
re-created through it from the original's own config must write the same
config, hold the same sublayers with the same dtype policies and the same
weights (shapes, dtypes, trainability) in the same order, and, given the
original's weights, compute the original's outputs on random inputs of the
shapes the original was called with. A repair that fails the check repairs
nothing: the rebuild refuses the layer by name, as it refuses a layer that
nothing repairs.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import NamedTuple

import keras
import numpy as np

_BASE_ARGUMENTS = ("name", "trainable", "dtype")
_TOLERANCE = 1e-5


class _Repair(NamedTuple):
    """How one class is re-created: ``write(layer)`` its config where ``get_config`` fails;
    ``create(cls, config)`` a new layer where ``from_config`` fails (``None``: not needed)."""

    write: Callable | None
    create: Callable | None


def _swin_patch_embedding_config(layer):
    """Swin ``PatchEmbedding``'s config, its ``norm_layer`` class as it is (the class's own
    ``get_config`` serializes the class as a layer object and raises ``TypeError``)."""
    return {**keras.layers.Layer.get_config(layer), "patch_size": layer.patch_size,
            "embed_dim": layer.embed_dim, "data_format": layer.data_format,
            "norm_layer": layer.norm_layer}


def _construct(cls, config):
    """``cls(**config)``, past a ``from_config`` that cannot read the config (Swin
    ``PatchEmbedding``'s deserializes ``norm_layer``, which the repaired config holds as a class)."""
    return cls(**config)


_DINOV3_BIASES = ("query_bias", "key_bias", "value_bias", "proj_bias")


def _dinov3_attention(cls, config):
    """``DINOV3Attention`` from its config, the biases under the names its constructor takes."""
    return cls.from_config({f"use_{key}" if key in _DINOV3_BIASES else key: value
                            for key, value in config.items()})


_REPAIRS = {
    "keras_hub.src.models.swin_transformer.swin_transformer_layers.PatchEmbedding":
        _Repair(write=_swin_patch_embedding_config, create=_construct),
    "keras_hub.src.models.dinov3.dinov3_layers.DINOV3Attention":
        _Repair(write=None, create=_dinov3_attention),
}


def _repair_of(layer):
    """The table's repair of ``layer``'s class (looked up by module and name), or ``None``."""
    cls = type(layer)
    return _REPAIRS.get(f"{cls.__module__}.{cls.__qualname__}")


def written_config(layer):
    """``layer``'s config written by its class's repair, or ``None`` where none writes one."""
    repair = _repair_of(layer)
    return repair.write(layer) if repair and repair.write else None


def created(layer, config):
    """A new layer of ``layer``'s class from ``config`` by a repair, or ``None`` where none applies.

    The class's entry in the table if it has one, else the general fallback
    (:func:`_without_base_arguments`). The new layer is not yet checked: see
    :func:`difference`.
    """
    repair = _repair_of(layer)
    create = repair.create if repair and repair.create else _without_base_arguments
    try:
        return create(type(layer), config)
    except (TypeError, ValueError):
        return None


def _without_base_arguments(cls, config):
    """A ``cls`` built without the base arguments (``name``, ``trainable``, ``dtype``) its
    constructor refuses, which are set on it afterwards; ``None`` where the constructor takes
    ``**kwargs`` or refuses another key of ``config`` (dropping it would build another layer)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    refused = set(config) - set(params)
    if not refused or not refused <= set(_BASE_ARGUMENTS):
        return None
    new = cls.from_config({key: value for key, value in config.items() if key not in refused})
    if "name" in refused:
        new.name = config["name"]
    if "trainable" in refused:
        new.trainable = config["trainable"]
    if "dtype" in refused:
        new.dtype_policy = keras.dtype_policies.get(config["dtype"])
    return new


def difference(layer, twin, arguments):
    """What tells ``twin`` from ``layer``, or ``None`` where nothing does.

    Args:
        layer: the original layer (its weights are read, never changed).
        twin: a new, unbuilt layer re-created by a repair from ``layer``'s own
            config; it is built here and given ``layer``'s weights.
        arguments: the ``keras.Operation`` arguments of one call of ``layer``
            (its node's), whose tensors give the shapes of the random inputs.
    """
    args, kwargs = _random_arguments(arguments)
    if args is None:
        return "its inputs have open sizes, so no twin of it can be checked"
    if "training" in kwargs:
        kwargs["training"] = False
    expected = keras.tree.flatten(layer(*args, **kwargs))
    twin(*args, **kwargs)  # builds it
    for what, mine, theirs in (("config", _config(layer), _config(twin)),
                               ("sublayers", _sublayers(layer), _sublayers(twin)),
                               ("weights", _weights(layer), _weights(twin))):
        if mine != theirs:
            return f"its twin differs in its {what}: {_differences(mine, theirs)}"
    twin.set_weights(layer.get_weights())
    got = keras.tree.flatten(twin(*args, **kwargs))
    return _outputs_difference(expected, got)


def _random_arguments(arguments):
    """``arguments`` with each tensor replaced by random values of its shape (an open batch
    axis: 2) and dtype; ``(None, None)`` where another axis has no size."""
    rng = np.random.default_rng(0)
    tensors = arguments.keras_tensors
    shapes = [((2,) + tuple(t.shape[1:])) if t.shape and t.shape[0] is None else tuple(t.shape)
              for t in tensors]
    if any(size is None for shape in shapes for size in shape):
        return None, None
    values = {}
    for t, shape in zip(tensors, shapes):
        dtype = keras.backend.standardize_dtype(t.dtype)
        values[id(t)] = (rng.normal(size=shape).astype(dtype) if "float" in dtype
                         else np.zeros(shape, dtype))

    def fill(x):
        return values[id(x)] if isinstance(x, keras.KerasTensor) else x

    return (keras.tree.map_structure(fill, arguments.args),
            keras.tree.map_structure(fill, dict(arguments.kwargs)))


def _config(layer):
    """``layer``'s config as its repair or its class writes it, without its name."""
    config = written_config(layer)
    config = layer.get_config() if config is None else config
    return {key: value for key, value in config.items() if key != "name"}


def _differences(mine, theirs):
    """The entries (by key of a dict, by place in a list) where ``theirs`` differs from ``mine``."""
    if isinstance(mine, dict):
        keys = list(mine) + [key for key in theirs if key not in mine]
        pairs = [(key, mine.get(key), theirs.get(key)) for key in keys]
    else:
        pairs = [(f"#{i}", a, b) for i, (a, b) in enumerate(itertools.zip_longest(mine, theirs))]
    return ", ".join(f"{key}: {b!r} instead of {a!r}" for key, a, b in pairs if a != b)


def _sublayers(layer):
    """Class, dtype policy and trainability of ``layer`` and each of its sublayers, in order
    (a base argument set afterwards reaches no sublayer: this finds it)."""
    return [(type(sub).__name__, sub.dtype_policy.name, sub.trainable)
            for sub in layer._flatten_layers(include_self=True, recursive=True)]


def _weights(layer):
    """Shape, dtype and trainability of each of ``layer``'s weights, in order (the order kept
    weights are copied in)."""
    return [(tuple(w.shape), w.dtype, w.trainable) for w in layer.weights]


def _outputs_difference(expected, got):
    """Where outputs ``got`` differ from ``expected`` beyond float32 round-off, or ``None``."""
    if len(got) != len(expected):
        return f"its twin returns {len(got)} tensors instead of {len(expected)}"
    for want, have in zip(expected, got):
        want, have = keras.ops.convert_to_numpy(want), keras.ops.convert_to_numpy(have)
        if want.shape != have.shape:
            return f"its twin's output has shape {have.shape} instead of {want.shape}"
        if not np.allclose(have, want, rtol=_TOLERANCE, atol=_TOLERANCE):
            return (f"its twin's outputs differ from the original's by up to "
                    f"{float(np.max(np.abs(have - want))):.3g} given the same weights and inputs")
    return None
