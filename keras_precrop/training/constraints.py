"""``MaskConstraint``: the Keras constraint that keeps pruned weights at zero; ``StepFactor``:
the one ``GradualPruning`` lends a weight during ``fit`` (``LentFactors``).

They live outside ``keras_precrop.pai`` so that ``import keras_precrop`` can
register ``MaskConstraint`` for ``keras.saving.load_model`` without loading the
pruners; see ``keras_precrop.pai.masks`` for how masks are applied.
"""

import base64
import contextlib
import math
import zlib

import keras
import numpy as np
from keras import ops


def _encode(mask):
    """Bit-packs and zlib-compresses a 0/1 array into an ASCII string."""
    bits = np.packbits(np.asarray(mask, dtype=bool).ravel())
    return base64.b64encode(zlib.compress(bits.tobytes(), 9)).decode("ascii")


def _decode(data, shape):
    """Inverse of :func:`_encode`."""
    size = math.prod(shape)
    bits = np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype=np.uint8)
    return np.unpackbits(bits, count=size).reshape(shape)


def _mask_tensor(mask):
    """The mask as the backend reads it: a ``tf.Variable`` on TensorFlow, else a tensor."""
    if keras.backend.backend() != "tensorflow":
        return ops.convert_to_tensor(mask)
    import tensorflow as tf

    with tf.init_scope():
        return tf.Variable(mask, trainable=False, name="mask")


@keras.saving.register_keras_serializable(package="keras_precrop")
class MaskConstraint(keras.constraints.Constraint):
    """Multiplies a weight by a fixed 0/1 mask after every optimizer update.

    On TensorFlow the mask lives in a non-trainable float32 ``tf.Variable``
    created in the current distribution strategy's scope (so every replica
    reads a local copy) rather than a graph constant, which would embed one
    copy per traced function and hit the 2 GB graph limit on large models.
    Load a masked model inside ``strategy.scope()`` to get mirrored masks. On
    JAX and PyTorch it is a backend tensor (a constant of the compiled train
    step on JAX, replicated like the weights under a data-parallel
    distribution).

    In ``get_config`` the mask is bit-packed, zlib-compressed and base64
    encoded, which round-trips exactly and stays small: masks for all 25.6M
    weights of a ResNet-50 take 0.5 MB of config at 1% density and 4.3 MB at
    50%, where a nested list of 0/1 would take about 77 MB. The alternative, a non-trainable mask weight on a
    wrapper layer, would change the model's layers and weight names.

    Args:
        mask: 0/1 array of the weight's shape (or the encoded string from
            ``get_config``).
        shape: the mask's shape; required only with an encoded mask.
        inner: an optional constraint the weight already had; it is applied
            before masking.
    """

    def __init__(self, mask, shape=None, inner=None):
        if isinstance(mask, str):
            mask = _decode(mask, tuple(shape))
        self._mask_array = np.asarray(mask, dtype=np.float32)
        self.inner = keras.constraints.get(inner)
        self._mask = _mask_tensor(self._mask_array)

    @property
    def mask(self):
        """The 0/1 mask as a float32 numpy array."""
        return self._mask_array

    def __call__(self, w):
        if self.inner is not None:
            w = self.inner(w)
        return w * ops.cast(self._mask, w.dtype)

    def get_config(self):
        return {
            "mask": _encode(self._mask_array),
            "shape": list(self._mask_array.shape),
            "inner": keras.constraints.serialize(self.inner) if self.inner else None,
        }


def distribution_scope(variable):
    """The ``tf.distribute`` scope ``variable`` lives in, so that a variable made beside it (a
    mask, a factor) is mirrored alike and every replica reads a local copy; else no scope."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if isinstance(variable.value, tf.distribute.DistributedValues):
            return variable.value.distribute_strategy.scope()
    return contextlib.nullcontext()


class StepFactor(keras.constraints.Constraint):
    """Multiplies a weight by a factor after every optimizer update, inside the train step.

    ``GradualPruning`` lends one to each weight it may mask, for the length of
    a ``fit`` (as ``variable.constraint``; never as the layer's attribute, so
    ``get_config`` and a model saved mid-fit never see it), and gives the
    weight its own constraint (``inner``, applied first) back when the fit
    ends. The factor (0/1 masks, times ``1 - shrink`` where channels fade) is a
    non-trainable variable that the host sets at mask updates only: the
    compiled step reads it as it reads the weights (TensorFlow captures the
    variable, not its value), so no step needs the host. Not for JAX, whose
    compiled step would keep the value it was traced with.

    Args:
        variable: the weight it multiplies; the factor takes its shape, dtype
            and ``tf.distribute`` scope, and starts at 1.
    """

    def __init__(self, variable):
        self.inner = None
        with distribution_scope(variable):
            self.factor = keras.Variable(np.ones(variable.shape), dtype=variable.dtype,
                                         trainable=False, name="step_factor")

    def __call__(self, w):
        if self.inner is not None:
            w = self.inner(w)
        return w * ops.cast(self.factor, w.dtype)

    def set(self, factor):
        """Make ``factor`` (an array of the weight's shape, or a number) what the steps multiply by."""
        self.factor.assign(np.broadcast_to(np.asarray(factor, np.float32), self.factor.shape))


def factors_in_step(model):
    """Whether ``model``'s train step applies a :class:`StepFactor` at the factor's value now.

    TensorFlow's traced step reads the factor variable itself; PyTorch runs its step eagerly
    (unless ``jit_compile``). JAX's compiled step takes as state only the model's and the
    optimizer's variables, and would keep the factors it was traced with.
    """
    backend = keras.backend.backend()
    return backend == "tensorflow" or (backend == "torch" and not getattr(model, "jit_compile", False))


def lend_call(layer, call):
    """Lend ``call`` to ``layer`` as its ``call`` attribute (over its class's method; the layer's
    config, weights and graph do not change). Returns the layer's own ``call`` attribute before
    (``None``: its class's), for :func:`give_back_call`."""
    own = layer.__dict__.get("call")
    layer.call = call
    return own


def give_back_call(layer, call, own):
    """Give ``layer`` its own call back (``own`` from :func:`lend_call`), where ``call`` is still
    the one lent to it (another lender may have lent its own since)."""
    if layer.__dict__.get("call") is call:
        if own is None:
            del layer.call
        else:
            layer.call = own


class LentFactors:
    """The :class:`StepFactor` s one ``GradualPruning`` lends to a model's weights, fit by fit, and
    the calls it lends to layers (a norm's statistics over the kept channels) for as long.

    Attributes:
        held: ``{id(weight): (weight, factor)}`` lent now (during a fit).
        calls: ``{id(layer): (layer, call, own)}`` lent now, as the layers' ``call``
            (``own``: the layer's own ``call`` attribute before, ``None`` for its class's).
    """

    def __init__(self):
        self.held, self.calls, self._factors, self._traced = {}, {}, {}, None

    def hold(self, model, weights, step, calls=()):
        """Lend a factor to each of ``weights`` (trained by ``model``'s fit, its optimizer's count
        at ``step``); the weight's own constraint applies first. Lend each ``(layer, call)`` of
        ``calls`` as ``layer.call`` (an attribute of the layer over its class's method; the
        layer's config, weights and graph do not change). ``model``'s train function is made
        anew unless it is the one the last :meth:`release` left, not run since (the count
        unchanged), on the same weights and calls: a function traced without them would skip
        them, and tracing again costs more than an epoch of a small model. Where calls are
        lent, its test and predict functions are made anew when next used (a validation in the
        fit computes with them)."""
        self.release(model, step)  # those a fit that raised (no on_train_end) left lent
        for w in weights:
            if id(w) not in self._factors:
                self._factors[id(w)] = StepFactor(w)
            factor, own = self._factors[id(w)], w.constraint
            if own is not factor:  # (another callback's, where its fit raised: the one it holds)
                factor.inner, w.constraint = own.inner if isinstance(own, StepFactor) else own, factor
            self.held[id(w)] = (w, factor)
        for layer, call in calls:
            self.calls[id(layer)] = (layer, call, lend_call(layer, call))
        if self._traced != (model.train_function, step, frozenset(self.held), frozenset(self.calls)):
            model.make_train_function(force=True)
        if self.calls:
            model.test_function = model.predict_function = None

    def set(self, factors):
        """Make ``factors`` (``{id(weight): array}``; 1 for a weight left out) what the steps
        multiply the weights held by."""
        for key, (_, factor) in self.held.items():
            factor.set(factors[key] if key in factors else 1.0)

    def release(self, model, step):
        """Give the weights their own constraints back and set the factors to 1, so that the train
        function traced with them (kept for the next :meth:`hold`) trains as if without them; give
        the layers their own calls back (their class's), and have the test and predict functions
        traced with the lent calls made anew. (The kept train function computes a lent norm's
        statistics over the channels its caller's keep vector holds: all of them, once set so.)"""
        if not self.held and not self.calls:
            return
        for w, factor in self.held.values():
            if w.constraint is factor:
                w.constraint = factor.inner
            factor.set(1.0)
        for layer, call, own in self.calls.values():
            give_back_call(layer, call, own)
        if self.calls:
            model.test_function = model.predict_function = None
        self._traced = (model.train_function, step, frozenset(self.held), frozenset(self.calls))
        self.held, self.calls = {}, {}
