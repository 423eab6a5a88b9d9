"""``SGDWithL2``: momentum SGD with the seed paper's coupled L2 weight decay.

It lives outside ``keras_precrop.train`` so that ``import keras_precrop`` can
register it for ``keras.saving.load_model`` (checkpoints) without loading the
training pipeline; ``keras_precrop.train.make_optimizer`` builds it.
"""

import math

import keras


@keras.saving.register_keras_serializable(package="keras_precrop")
class SGDWithL2(keras.optimizers.SGD):
    """Momentum SGD with L2 weight decay on conv/dense kernels only.

    The seed paper trains with PyTorch's ``SGD(weight_decay=wd)``, which adds
    ``wd * w`` to the gradient before the momentum update (coupled L2). Keras'
    own ``weight_decay`` is decoupled (``w -= lr * wd * w`` outside the
    momentum), which at momentum 0.9 decays about 10x less for the same
    coefficient, so the table's values would not carry over; this class
    keeps the coupled form. Only variables of rank >= 2 (conv, depthwise and
    dense kernels) are decayed: BatchNorm scales/offsets and biases are rank
    1. The rule depends on shapes, not names, so it survives ``.keras``
    save/load and renamed layers.

    Args:
        l2: decay coefficient (the table's "weight decay").
        **kwargs: ``keras.optimizers.SGD`` arguments (``learning_rate``,
            ``momentum``, ...); Keras' decoupled ``weight_decay`` is refused.
    """

    def __init__(self, l2=0.0, **kwargs):
        if kwargs.get("weight_decay"):
            raise ValueError(
                "SGDWithL2 applies coupled L2 through `l2`; do not also pass Keras' "
                f"decoupled weight_decay={kwargs['weight_decay']!r}."
            )
        if not isinstance(l2, (int, float)) or not math.isfinite(l2) or l2 < 0:
            raise ValueError(f"l2 must be a finite number >= 0, got {l2!r}.")
        super().__init__(**kwargs)
        self.l2 = float(l2)

    @staticmethod
    def decays(variable):
        """True for the variables L2 applies to: kernels, i.e. rank >= 2."""
        return len(variable.shape) >= 2

    def update_step(self, gradient, variable, learning_rate):
        """Adds ``l2 * variable`` to a kernel's gradient, then takes the SGD step."""
        if self.l2 and self.decays(variable):
            gradient = gradient + keras.ops.cast(self.l2, variable.dtype) * variable
        super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        """Adds ``l2`` to SGD's config."""
        return {**super().get_config(), "l2": self.l2}
