"""Data batches and the loss that SNIP and GraSP differentiate."""

import keras
import numpy as np
import tensorflow as tf


def batches(data, num_batches=None):
    """Returns the ``(x, y)`` batches of ``data`` as a list of tensors.

    Args:
        data: an ``(x, y)`` pair of arrays/tensors (one batch), a
            ``tf.data.Dataset`` of ``(x, y)`` batches, or any iterable of
            ``(x, y)`` batches. Extra elements (sample weights) are ignored.
        num_batches: use at most this many batches; ``None`` for all (an
            infinite dataset then needs ``num_batches``).

    Raises:
        ValueError: for malformed data, no batch at all, an infinite dataset
            without ``num_batches``, or non-finite inputs.
    """
    if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 1):
        raise ValueError(f"num_batches must be a positive int or None, got {num_batches!r}.")
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], tuple):
        items = [data]
    else:
        if isinstance(data, tf.data.Dataset):
            if num_batches is None and data.cardinality() == tf.data.INFINITE_CARDINALITY:
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
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise ValueError(f"Batch {i} of data is not an (x, y) pair: {type(item).__name__}.")
        x, y = tf.convert_to_tensor(item[0]), tf.convert_to_tensor(item[1])
        if x.dtype.is_floating and not np.all(np.isfinite(x.numpy())):
            raise ValueError(f"Batch {i} of data has NaN or Inf inputs.")
        out.append((x, y))
    if not out:
        raise ValueError("data yielded no batch.")
    return out


def cross_entropy(y_true, logits):
    """Mean cross-entropy of logits, for integer labels or one-hot targets.

    The reference uses ``nn.CrossEntropyLoss`` on logits; one-hot (or soft)
    targets are recognised by having the logits' rank.
    """
    if len(y_true.shape) == len(logits.shape):
        return keras.losses.categorical_crossentropy(y_true, logits, from_logits=True)
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)


def loss_value(model, loss, x, y, training, temperature=1.0):
    """``mean(loss(y, model(x) / temperature))`` as a scalar of the model's dtype."""
    outputs = model(x, training=training)
    if temperature != 1.0:
        outputs = outputs / temperature
    return tf.reduce_mean((loss or cross_entropy)(y, outputs))
