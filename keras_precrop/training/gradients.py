"""Gradients on every Keras backend, data batches and the cross-entropy they differentiate.

The loss gradients that Taylor importance ranks channels by
(``transfer/taylor.py``) and those of the pruning baselines (SNIP, GraSP,
SynFlow in ``keras_precrop.pai``, which reads this module as
``keras_precrop.pai.gradients``) come from here. Each backend
differentiates with its own machinery (TensorFlow's ``GradientTape``,
``jax.value_and_grad``, ``torch.autograd``); :func:`value_and_grad` hides
them behind one function of a list of tensors, and everything else is
written in ``keras.ops``. Gradients with respect to a
model's weights (:func:`weight_gradients`, :func:`hessian_gradient_product`)
swap the weights for traced values with ``keras.StatelessScope``, so the model
is never modified: not its weights, and not its BatchNorm statistics when it
runs in training mode.
"""

import contextlib
import sys

import keras
import numpy as np
from keras import ops

from keras_precrop.training._user_data import is_array, is_pair

BACKENDS = ("tensorflow", "jax", "torch")


def _backend():
    """The Keras backend's name, after checking the pruners support it."""
    name = keras.backend.backend()
    if name not in BACKENDS:
        raise NotImplementedError(
            f"keras_precrop computes gradients on the {', '.join(BACKENDS)} backends, "
            f"not on Keras' {name!r} backend; set KERAS_BACKEND to one of those."
        )
    return name


def value_and_grad(fn, values, higher_order=False):
    """``fn(values)`` and its gradients with respect to the tensors in ``values``.

    Args:
        fn: a function of a list of tensors returning a scalar tensor, written
            in backend-independent ops (``keras.ops``, Keras layers).
        values: the list of tensors to differentiate with respect to.
        higher_order: keep the gradients differentiable, for a call inside a
            function that is itself passed to ``value_and_grad`` (second
            derivatives, as GraSP needs). TensorFlow and JAX always can;
            PyTorch must be told to record the backward pass.

    Returns:
        ``(value, grads)``: the scalar and one gradient per tensor of
        ``values``; a tensor ``fn`` does not depend on gets zeros.

    Raises:
        NotImplementedError: on a Keras backend other than TensorFlow, JAX
            and PyTorch.
    """
    backend = _backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(values)
            value = fn(values)
        return value, tape.gradient(value, values, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    if backend == "jax":
        import jax

        return jax.value_and_grad(fn)(list(values))
    import torch

    # Inside an outer differentiation the values already require gradients and
    # must stay connected to it; otherwise they become leaves of a new graph.
    values = [v if v.requires_grad else v.detach().requires_grad_() for v in values]
    value = fn(values)
    grads = torch.autograd.grad(value, values, create_graph=higher_order, allow_unused=True)
    return value, [torch.zeros_like(v) if g is None else g for v, g in zip(values, grads)]


def compiled(fn):
    """``fn`` compiled once by the backend's tracer (``tf.function``, ``jax.jit``).

    PyTorch runs eagerly, so ``fn`` is returned as is there. The compiled
    function takes tensors of fixed shapes and dtypes, so it traces once.
    """
    backend = _backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, autograph=False)
    if backend == "jax":
        import jax

        return jax.jit(fn)
    return fn


def precision(dtype):
    """A context in which the backend computes in ``dtype``.

    JAX computes in 32 bits unless 64-bit types are enabled; this enables them
    for ``"float64"`` (a no-op on the other backends and dtypes).
    """
    if dtype == "float64" and _backend() == "jax":
        import jax

        return jax.enable_x64(True)
    return contextlib.nullcontext()


def _values(variables):
    """Tensors holding the current values of Keras ``variables`` (to differentiate by)."""
    return [ops.convert_to_tensor(v.numpy()) for v in variables]


def _stateless(fn, variables):
    """``fn`` (which reads ``variables``) as a function of the variables' values."""

    def pure(values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return fn()

    return pure


def weight_gradients(fn, variables):
    """Gradients of ``fn()`` with respect to the Keras ``variables`` it reads.

    Returns:
        ``[float64 numpy array]``, one per variable.
    """
    _, grads = value_and_grad(_stateless(fn, variables), _values(variables))
    return [ops.convert_to_numpy(g).astype(np.float64) for g in grads]


def hessian_gradient_product(fn, variables, vectors):
    """``H v``: the gradient of ``v . d fn()/d w`` with respect to ``variables`` ``w``.

    Args:
        fn: a function reading ``variables`` and returning a scalar tensor.
        variables: Keras variables.
        vectors: arrays ``v`` of the variables' shapes, held constant.

    Returns:
        ``[float64 numpy array]``, one per variable.
    """
    pure = _stateless(fn, variables)
    vectors = [ops.convert_to_tensor(np.asarray(v), dtype=w.dtype) for v, w in zip(vectors, variables)]

    def directional(values):
        _, grads = value_and_grad(pure, values, higher_order=True)
        return sum(ops.sum(v * g) for v, g in zip(vectors, grads))

    _, products = value_and_grad(directional, _values(variables))
    return [ops.convert_to_numpy(p).astype(np.float64) for p in products]


def _is_tf_dataset(data):
    """Whether ``data`` is a ``tf.data.Dataset`` (never imports TensorFlow itself)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def batches(data, num_batches=None, labels=True):
    """Returns the ``(x, y)`` batches of ``data`` as a list of backend tensors.

    Args:
        data: an ``(x, y)`` pair of arrays/tensors (one batch), a
            ``tf.data.Dataset`` of ``(x, y)`` batches, or any iterable of
            ``(x, y)`` batches (a ``torch.utils.data.DataLoader``, a list).
            Extra elements (sample weights) are ignored.
        num_batches: use at most this many batches; ``None`` for all (an
            infinite dataset then needs ``num_batches``).
        labels: whether every batch must hold labels; where not, a batch
            may be inputs alone (an array, a dict of a model's inputs, an
            ``(x,)`` tuple; ``data`` itself an array is one batch), given
            as ``(x, None)``.

    Raises:
        ValueError: for malformed data, no batch at all, an infinite dataset
            without ``num_batches``, or non-finite inputs.
    """
    if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 1):
        raise ValueError(f"num_batches must be a positive int or None, got {num_batches!r}.")
    if is_pair(data) or (not labels and (is_array(data) or isinstance(data, dict))):
        items = [data]
    else:
        if _is_tf_dataset(data):
            infinite = sys.modules["tensorflow"].data.INFINITE_CARDINALITY
            if num_batches is None and data.cardinality() == infinite:
                raise ValueError("data is an infinite tf.data.Dataset; pass num_batches.")
            if num_batches is not None:
                data = data.take(num_batches)
        try:
            iterator = iter(data)
        except TypeError:
            raise ValueError(
                f"data must be an (x, y) pair or an iterable of (x, y) batches, got {type(data).__name__}."
            ) from None
        items = []
        for item in iterator:
            items.append(item)
            if num_batches is not None and len(items) == num_batches:
                break
    out = []
    for i, item in enumerate(items):
        # x may be a model's several inputs (a list, tuple or dict of arrays): each converted alone.
        x, y = (None if t is None else keras.tree.map_structure(
            lambda a: np.asarray(ops.convert_to_numpy(a)), t) for t in _x_y(item, i, labels))
        leaves = keras.tree.flatten(x)
        if any(np.issubdtype(t.dtype, np.floating) and not np.all(np.isfinite(t)) for t in leaves):
            raise ValueError(f"Batch {i} of data has NaN or Inf inputs.")
        out.append(tuple(None if t is None else keras.tree.map_structure(ops.convert_to_tensor, t)
                         for t in (x, y)))
    if not out:
        raise ValueError("data yielded no batch.")
    return out


def _x_y(item, index, labels):
    """``(x, y)`` of one batch; ``y`` None for inputs alone where ``labels`` is False."""
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[0], item[1]
    if labels:
        raise ValueError(f"Batch {index} of data is not an (x, y) pair: {type(item).__name__}.")
    return (item[0] if isinstance(item, (tuple, list)) else item), None


def cross_entropy(y_true, logits, from_logits=True):
    """Mean cross-entropy of logits, for integer labels or one-hot targets.

    The reference uses ``nn.CrossEntropyLoss`` on logits; one-hot (or soft)
    targets are recognised by having the logits' rank. ``from_logits=False``
    takes the outputs as a softmax's probabilities (a model that ends in one).
    """
    if len(y_true.shape) == len(logits.shape):
        return keras.losses.categorical_crossentropy(y_true, logits, from_logits=from_logits)
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=from_logits)


def loss_value(model, loss, x, y, training, temperature=1.0):
    """``mean(loss(y, model(x) / temperature))`` as a scalar of the model's dtype."""
    outputs = model(x, training=training)
    if temperature != 1.0:
        outputs = outputs / temperature
    return ops.mean((loss or cross_entropy)(y, outputs))
