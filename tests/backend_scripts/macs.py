"""MACs by hand from kernel and activation shapes, next to ``profile``'s, on any Keras backend.

Usage: ``python macs.py`` prints one JSON object: per model, ``{"reference":
{layer: MACs}, "profile": {layer: MACs}, "total_macs": profile's total}``,
layers with no MACs left out.
``tests/test_backends.py`` runs it under JAX and PyTorch with TensorFlow
hidden, where TensorFlow's traced graph (the suite's MAC reference) is not
available, and checks the two agree; under TensorFlow it also checks the
reference against that graph, so the formulas here are checked themselves.

The reference is not the walker: each layer's multiply-accumulates per
example come from its own kernel's shape and its input/output shape
(``prod(output pixels) * kh * kw * c_in / groups * c_out`` for a
convolution), and layers without a kernel (batch norm, adds, activations,
pooling) have none, as in TensorFlow's graph, which counts only convolutions
and matrix products.
"""

import json
import math

import keras

L = keras.layers


def _pixels(shape):
    """Positions per example: every axis but the batch and the channels."""
    return math.prod(shape[1:-1])


def _conv(layer):
    k_h, k_w, c_in_per_group, c_out = layer.kernel.shape  # c_in / groups inputs per output
    return _pixels(layer.output.shape) * k_h * k_w * c_in_per_group * c_out


def _depthwise(layer):
    k_h, k_w, c_in, multiplier = layer.kernel.shape
    return _pixels(layer.output.shape) * k_h * k_w * c_in * multiplier


def _separable(layer):
    k_h, k_w, c_in, multiplier = layer.depthwise_kernel.shape
    _, _, c_mid, c_out = layer.pointwise_kernel.shape
    return _pixels(layer.output.shape) * (k_h * k_w * c_in * multiplier + c_mid * c_out)


def _transpose(layer):
    """A transposed convolution does its work per *input* pixel."""
    k_h, k_w, c_out, c_in = layer.kernel.shape
    return _pixels(layer.input.shape) * k_h * k_w * c_in * c_out


def _dense(layer):
    c_in, c_out = layer.kernel.shape
    return _pixels(layer.output.shape) * c_in * c_out


_FORMULAS = {
    L.Conv2D: _conv,
    L.DepthwiseConv2D: _depthwise,
    L.SeparableConv2D: _separable,
    L.Conv2DTranspose: _transpose,
    L.Dense: _dense,
}


def reference_macs(model):
    """``{layer name: MACs per example}`` of the layers with a kernel (the others have none)."""
    macs = {}
    for layer in model.layers:
        formula = _FORMULAS.get(type(layer))
        if formula is None:
            assert not any("kernel" in w.path for w in layer.weights), f"no formula for {layer.name}"
            continue
        macs[layer.name] = int(formula(layer))
    return macs


def kernels_only():
    """Only layers with kernels (and a Flatten), no batch norm: its MACs are exactly the kernels'.

    Strided and valid padding, a non-square kernel, a depthwise conv with a
    multiplier, a grouped conv, a separable and a strided transposed conv, a
    Dense on every pixel and a Dense after Flatten.
    """
    keras.utils.set_random_seed(0)
    x = inputs = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", name="conv_s2")(x)  # 8x8x8
    x = L.Conv2D(6, (3, 1), use_bias=False, name="conv_valid_3x1")(x)  # 6x8x6
    x = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="depthwise_x2")(x)  # 6x8x12
    x = L.Conv2D(8, 3, padding="same", groups=4, name="grouped_4")(x)  # 3 in, 2 out per group
    x = L.SeparableConv2D(10, 3, strides=2, padding="same", name="separable_s2")(x)  # 3x4x10
    x = L.Conv2DTranspose(5, 3, strides=2, padding="same", name="transpose_s2")(x)  # 6x8x5
    x = L.Dense(7, name="dense_per_pixel")(x)  # 6x8x7
    x = L.Dense(4, name="head")(L.Flatten(name="flatten")(x))
    return keras.Model(inputs, x, name="kernels_only")


def resnet20():
    """ResNet-20 from the zoo: batch norm, adds, ReLUs and pooling around its kernels."""
    from keras_precrop import models

    keras.utils.set_random_seed(0)
    return models.get("resnet20")


MODELS = {"kernels_only": kernels_only, "resnet20": resnet20}


def run():
    from keras_precrop import profile

    out = {}
    for name, build in MODELS.items():
        model = build()
        prof = profile(model)
        out[name] = {
            "reference": reference_macs(model),
            "profile": {row.name: int(row.macs) for row in prof.layers if row.macs},
            "total_macs": int(prof.total_macs),
        }
    return out


if __name__ == "__main__":
    print(json.dumps({"backend": keras.backend.backend(), "models": run()}))
