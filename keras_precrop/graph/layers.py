"""Custom layers that rebuilt models use for residual streams.

With PreCrop's prefix semantics a layer that reads a residual stream takes its
first ``k`` channels (:class:`ChannelSlice`) and a layer that writes into the
stream adds its output into the stream's first channels (:class:`PrefixAdd`),
so blocks on one stream can have different widths without padding tensors.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_precrop")
class ChannelSlice(keras.layers.Layer):
    """Keep the first ``width`` channels (last axis) of the input.

    Args:
        width: number of leading channels to keep (positive integer).
    """

    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        if int(width) != width or width < 1:
            raise ValueError(f"ChannelSlice width must be a positive integer, got {width!r}")
        self.width = int(width)

    def call(self, inputs):
        # A slice op rather than strided indexing: its gradient is a cheap pad
        # (TF's StridedSliceGrad cost ~9% of a ResNet-20 training step). Sizes
        # are explicit: a size of -1 means "the rest" to TF and JAX but "all
        # but the last element" to the torch backend.
        shape = ops.shape(inputs)
        return ops.slice(inputs, (0,) * len(shape), (*shape[:-1], self.width))

    def compute_output_shape(self, input_shape):
        if input_shape[-1] is not None and input_shape[-1] < self.width:
            raise ValueError(
                f"{self.name}: cannot keep {self.width} channels of an input "
                f"with {input_shape[-1]}."
            )
        return tuple(input_shape[:-1]) + (self.width,)

    def get_config(self):
        return {**super().get_config(), "width": self.width}


@keras.saving.register_keras_serializable(package="keras_precrop")
class PrefixAdd(keras.layers.Layer):
    """Sum tensors that differ in channel count, aligned on their first channels.

    The output has the channel count of the widest input; a narrower input is
    added into the leading channels only (equivalent to zero-padding it).
    """

    def call(self, inputs):
        width = max(x.shape[-1] for x in inputs)
        total = None
        for x in sorted(inputs, key=lambda t: -t.shape[-1]):
            k = x.shape[-1]
            if k < width:
                pad = [[0, 0]] * (len(x.shape) - 1) + [[0, width - k]]
                x = ops.pad(x, pad)
            total = x if total is None else total + x
        return total

    def compute_output_shape(self, input_shape):
        width = max(s[-1] for s in input_shape)
        return tuple(input_shape[0][:-1]) + (width,)
