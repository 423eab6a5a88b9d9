"""SynFlow (Tanaka et al., 2020): iterative, data-free pruning by synaptic flow.

Follows the Synaptic-Flow reference (``Pruners/pruners.py`` and ``prune.py``):
every parameter and BatchNorm statistic is replaced by its absolute value, the
network runs in inference mode on an all-ones input, ``R`` is the sum of its
outputs, each prunable weight scores ``|w * dR/dw|``, and the weights are
pruned globally to ``density ** (k / iterations)`` in round ``k``, with pruned
weights held at zero in later rounds.

Deliberate deviations, each to make the result exact and reproducible:

* Precision: ``R`` grows roughly geometrically with depth (about 1e25 on
  ResNet-20, 1e140 on ResNet-110), which overflows float32, the reference's
  precision. With ``dtype="auto"`` the linearized copy runs in float32 (4x
  faster than float64 on CPU) while ``R`` stays within ``[1e-30, 1e30]``
  and every score is finite, and switches to float64 otherwise (on JAX with
  64-bit types enabled for the computation). On PyTorch, Keras computes Dense
  layers in float32 even in float64, so flows beyond float32's range raise
  there with a hint to use another backend.
* Ties at the pruning threshold are broken by position and weights pruned in
  an earlier round never come back, so exactly ``round(density * n)``
  weights are kept. (The reference prunes ``int((1 - d) * n)`` per round,
  which can keep one weight more; with the same count rule both give the
  same masks, see ``benchmarks/results/synflow.md``.)
* The model itself is left untouched (the reference linearizes it in place
  and restores the signs afterwards): the absolute values are fed through
  ``stateless_call``. The result is a dict of masks for :func:`apply_masks`.
"""

import keras
import numpy as np
from keras import ops

from keras_precrop import progress as _progress
from keras_precrop.graph import trace
from keras_precrop.graph.rebuild import layer_from_config
from keras_precrop.pai import common, gradients

# float32 is used while R stays in this range: 8 orders of magnitude of
# headroom for activations and gradients (float32 spans 1e-38 .. 3e38).
_FLOAT32_FLOW_RANGE = (1e-30, 1e30)
_DTYPES = ("auto", "float32", "float64")
# What to try when the flow overflows. On PyTorch, Keras computes Dense layers'
# matrix products in float32 even for float64 layers (its type promotion maps
# 64-bit results to 32 bits off TensorFlow), so float64 cannot help there.
_FLOAT64_HINTS = {
    ("float32", "tensorflow"): "; try dtype='float64'.",
    ("float32", "jax"): "; try dtype='float64'.",
    ("float64", "torch"): (
        " on the torch backend, where Keras computes Dense layers in float32 even in "
        "float64; run SynFlow for this model under KERAS_BACKEND=tensorflow or jax."
    ),
}


def _capped(layer):
    """Whether ``layer`` applies a ReLU with a cap (``relu6``, ``ReLU(max_value=...)``).

    SynFlow's network is linear on its all-positive flow, where a ReLU is the
    identity; a cap would saturate at 6 instead, zeroing every gradient
    behind it (on MobileNetV2 all but the first layers then score zero and
    are emptied). The linearized copy runs such layers as plain ReLUs.
    """
    if isinstance(layer, keras.layers.ReLU):
        return layer.max_value is not None
    return getattr(layer, "activation", None) is keras.activations.relu6


def _usable_as_is(model, dtype):
    """Whether ``model`` itself can run the flow: stored and computed in ``dtype``, no capped ReLU."""
    layers = list(common.iter_layers(model))
    return (
        all(v.dtype == dtype for v in model.weights)
        and all(layer.compute_dtype == dtype for layer in layers)
        and not any(_capped(layer) for layer in layers)
    )


def _clone_in(model, dtype, name):
    """A structural copy of ``model`` computing in ``dtype``, with ReLU caps removed (see ``_capped``).

    ``name(layer)`` names each copy (a traced model's layers by their place,
    since two blocks' sublayers may share a name).
    """

    def clone_layer(layer):
        config = layer.get_config()
        config.update(dtype=dtype, name=name(layer))
        if _capped(layer):
            relu = isinstance(layer, keras.layers.ReLU)
            config.update({"max_value": None} if relu else {"activation": "relu"})
        return layer_from_config(layer, config)

    try:
        clone = keras.models.clone_model(model, clone_function=clone_layer, recursive=True)
    except ValueError as err:
        raise ValueError(
            f"SynFlow needs a Functional or Sequential model to build its {dtype} "
            f"linearized copy; cloning {model.name!r} failed: {err}"
        ) from err
    if [tuple(v.shape) for v in clone.variables] != [tuple(v.shape) for v in model.variables]:
        raise ValueError(
            f"The {dtype} clone of {model.name!r} does not have the model's weights; "
            "a custom layer does not round-trip through get_config/from_config."
        )
    return clone


# The all-ones input has two identical rows and the flow is their mean, so it equals a
# one-row flow: TensorFlow 2.21's oneDNN filter gradient of a 1x1 stride-2 convolution (a
# ResNet projection shortcut) crashes the process on a batch of one.
_ROWS = 2


class _LinearizedModel:
    """The model with every weight replaced by ``|w|``, run in ``dtype``, scoring masked weights.

    The network runs through ``stateless_call`` with the absolute values as
    constants, so the model's own weights are never touched. A model that
    already computes in ``dtype`` (and has no capped ReLU) is used directly;
    otherwise a copy with ``dtype`` layers is built (its own weights are never
    read). The score step is compiled once (``tf.function``, ``jax.jit``;
    PyTorch runs eagerly); each call to :meth:`flow_and_scores` only runs it.
    """

    def __init__(self, traced, paths, input_shape, dtype):
        model = traced.functional
        with gradients.precision(dtype):
            target = model if _usable_as_is(model, dtype) else _clone_in(model, dtype, traced.name)
            source = {id(t): s for t, s in zip(target.variables, model.variables)}
            self._trainable = [self._abs(source[id(v)], v, dtype) for v in target.trainable_variables]
            self._non_trainable = [self._abs(source[id(v)], v, dtype) for v in target.non_trainable_variables]
            self._inputs = [ops.ones((_ROWS, *_input_shape(t, input_shape)), dtype)
                            for t in target.inputs]
        position = {id(source[id(v)]): i for i, v in enumerate(target.trainable_variables)}
        prunable = common.prunable_weights(model, include_bias=True, include_batchnorm=True)
        self.dtype = dtype
        self.paths = list(paths)
        self.shapes = [tuple(prunable[p].shape) for p in paths]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self._offsets = np.cumsum([0, *self.sizes]).tolist()
        self._positions = [position[id(prunable[p])] for p in paths]
        self._target = target
        self._step = gradients.compiled(self._flow)

    @staticmethod
    def _abs(variable, target, dtype):
        """``|variable|`` in ``dtype``; non-float state (seed generators) is passed through."""
        if not keras.backend.is_float_dtype(variable.dtype):
            return ops.convert_to_tensor(target.numpy())
        return ops.convert_to_tensor(np.abs(np.asarray(variable.numpy(), np.float64)).astype(dtype))

    def _flow(self, flat_mask):
        """``R`` of the linearized model under ``flat_mask`` and the flat scores ``|w * dR/dw|``."""
        masked = [
            self._trainable[i] * ops.reshape(flat_mask[start:stop], shape)
            for i, start, stop, shape in zip(
                self._positions, self._offsets[:-1], self._offsets[1:], self.shapes
            )
        ]
        inputs = self._inputs[0] if len(self._inputs) == 1 else self._inputs

        def flow_of(masked):
            values = list(self._trainable)
            for i, value in zip(self._positions, masked):
                values[i] = value
            outputs, _ = self._target.stateless_call(values, self._non_trainable, inputs, training=False)
            return sum(ops.sum(ops.cast(o, self.dtype)) for o in keras.tree.flatten(outputs)) / _ROWS

        flow, grads = gradients.value_and_grad(flow_of, masked)
        return flow, ops.concatenate([ops.reshape(ops.abs(w * g), [-1]) for w, g in zip(masked, grads)], 0)

    def flow_and_scores(self, flat_mask):
        """``R`` and the flat scores ``|w * dR/dw|`` (in ``dtype``) under a flat 0/1 mask."""
        with gradients.precision(self.dtype):
            flow, scores = self._step(ops.convert_to_tensor(np.asarray(flat_mask, self.dtype)))
            return float(ops.convert_to_numpy(flow)), ops.convert_to_numpy(scores)

    def unflatten(self, flat):
        """Splits a flat array into ``{path: array of the weight's shape}``."""
        parts = np.split(flat, self._offsets[1:-1])
        return {p: a.reshape(shape) for p, a, shape in zip(self.paths, parts, self.shapes)}


def _input_shape(tensor, input_shape):
    """The shape (no batch axis) of ``tensor``'s all-ones input: its own, or ``input_shape``."""
    shape = tuple(tensor.shape[1:])
    if None not in shape:
        return shape
    if input_shape is None:
        raise ValueError(
            f"Input {tensor.name!r} has undefined dimensions {shape}; pass "
            "input_shape=(height, width, channels) to synflow."
        )
    input_shape = tuple(input_shape)
    if len(input_shape) != len(shape) or any(d is not None and d != s for d, s in zip(shape, input_shape)):
        raise ValueError(f"input_shape {input_shape} does not fit the model input shape {shape}.")
    return input_shape


def _scorer(model, include_bias, include_batchnorm, input_shape, dtype):
    """The scorer of ``model``'s prunable weights, from one trace of the model."""
    traced = trace.traced(model)
    paths = list(common.prunable_weights(traced.functional, include_bias, include_batchnorm))
    return _Scorer(traced, paths, input_shape, dtype)


class _Scorer:
    """Scores with a float32 linearized copy while its flow fits, float64 otherwise."""

    def __init__(self, traced, paths, input_shape, dtype):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}.")
        self._args = (traced, paths, input_shape)
        self._auto = dtype == "auto"
        self.linearized = _LinearizedModel(*self._args, "float32" if self._auto else dtype)

    def scores(self, flat_mask):
        """The flat SynFlow scores under ``flat_mask``, retried in float64 where float32 overflows."""
        flow, scores = self.linearized.flow_and_scores(flat_mask)
        if self._auto and self.linearized.dtype == "float32":
            low, high = _FLOAT32_FLOW_RANGE
            if not (low <= flow <= high and np.isfinite(scores).all()):
                self.linearized = _LinearizedModel(*self._args, "float64")
                flow, scores = self.linearized.flow_and_scores(flat_mask)
        if not (np.isfinite(flow) and np.isfinite(scores).all()):
            raise FloatingPointError(
                f"SynFlow's linearized output R = {flow} or its gradients are not "
                f"finite in {self.linearized.dtype}: the network is too deep or its "
                "weights too large for synaptic flow to be represented"
                + _FLOAT64_HINTS.get((self.linearized.dtype, keras.backend.backend()), ".")
            )
        return scores


def _keep_round(scores, alive, density, sizes, scope):
    """Indices (a subset of ``alive``) kept after one round at ``density``.

    Only alive weights compete, so a pruned weight never returns; ``alive``
    is sorted, so ties still go to the weight that comes first.
    """
    if scope == "global":
        keep = common.top_k(scores[alive], common.num_kept(density, sum(sizes), "the prunable weights"))
        return alive[keep]
    bounds = np.searchsorted(alive, np.cumsum([0, *sizes]))
    kept = []
    for size, lo, hi in zip(sizes, bounds[:-1], bounds[1:]):
        segment = alive[lo:hi]
        kept.append(segment[common.top_k(scores[segment], common.num_kept(density, size, "a weight"))])
    return np.concatenate(kept)


def synflow_scores(model, masks=None, include_bias=False, include_batchnorm=False, input_shape=None,
                   dtype="auto"):
    """One round of SynFlow scores, ``|w * dR/dw|`` of the linearized network.

    Args:
        model: a built Functional or Sequential Keras model.
        masks: optional ``{path: 0/1 array}``; masked weights are zero while
            scoring (and score zero). Missing paths are unmasked.
        include_bias: also score biases.
        include_batchnorm: also score BatchNorm gamma and beta.
        input_shape: per-example input shape, needed only when the model's
            input has undefined dimensions.
        dtype: ``"auto"`` (float32 while the flow fits, else float64),
            ``"float32"`` or ``"float64"``.

    Returns:
        ``{path: float64 array}`` for every prunable weight.
    """
    scorer = _scorer(model, include_bias, include_batchnorm, input_shape, dtype)
    paths = scorer.linearized.paths
    masks = masks or {}
    shapes = scorer.linearized.shapes
    flat = np.concatenate(
        [np.broadcast_to(np.asarray(masks.get(p, 1.0), np.float64), s).ravel() for p, s in zip(paths, shapes)]
    )
    scores = scorer.scores(flat).astype(np.float64)
    return scorer.linearized.unflatten(scores)


def synflow(
    model,
    density,
    iterations=100,
    schedule="exponential",
    scope="global",
    include_bias=False,
    include_batchnorm=False,
    input_shape=None,
    dtype="auto",
    verbose=1,
):
    """Prunes ``model``'s weights to ``density`` with SynFlow; no data needed.

    Deterministic: the same weights give the same masks (no randomness is
    involved; the model's initialization seed decides the result).

    Args:
        model: a built Functional or Sequential Keras model (not modified).
        density: fraction of prunable weights kept, in (0, 1].
        iterations: pruning rounds (the reference's 100).
        schedule: ``"exponential"`` (density ``d ** (k / iterations)`` after
            round ``k``, the reference's default) or ``"linear"``.
        scope: ``"global"`` (one threshold over all weights) or ``"local"``.
        include_bias: also prune biases.
        include_batchnorm: also prune BatchNorm gamma and beta.
        input_shape: per-example input shape, needed only when the model's
            input has undefined dimensions.
        dtype: precision of the linearized network: ``"auto"`` (float32 while
            the flow stays within ``[1e-30, 1e30]``, else float64),
            ``"float32"`` (the reference's) or ``"float64"``.
        verbose: 0 silent, 1 progress (a bar on a terminal, plain lines in a
            log file), 2 one line at the end.

    Returns:
        ``{weight path: float32 0/1 array}`` keeping exactly
        ``round(density * n)`` of the ``n`` prunable weights (per weight with
        ``scope="local"``).

    Raises:
        ValueError: for a density outside (0, 1], a bad schedule, scope or
            dtype, or a model that cannot be cloned.
        FloatingPointError: if the synaptic flow overflows float64.
    """
    density = common.check_density(density)
    densities = common.density_schedule(density, iterations, schedule)
    common.check_scope(scope)
    scorer = _scorer(model, include_bias, include_batchnorm, input_shape, dtype)
    sizes = scorer.linearized.sizes
    alive = np.arange(sum(sizes))
    flat_mask = np.ones(alive.size)
    progress = _progress.progbar(iterations, verbose, stateful_metrics=["density"])
    for k, round_density in enumerate(densities):
        scores = scorer.scores(flat_mask)
        alive = _keep_round(scores, alive, round_density, sizes, scope)
        flat_mask[:] = 0.0
        flat_mask[alive] = 1.0
        progress.update(k + 1, [("density", round_density)])
    return {p: m.astype(np.float32) for p, m in scorer.linearized.unflatten(flat_mask).items()}
