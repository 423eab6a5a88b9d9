"""A custom layer with a kernel, taught to the package by one handler in one place.

``TinyConv`` is a convolution written from ``keras.ops`` (not a subclass of a
Keras conv layer, so nothing built in knows it). Registering
``TinyConvHandler`` is all it takes for profiling, PreCrop (solve and
rebuild) and the pruning-at-initialization baselines to handle it; each is
checked against an independent reference (Keras' parameter count,
TensorFlow's graph MACs, synaptic flow, forward passes).
"""

import doctest
import math

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import pai
from keras_precrop.channels import output_shape
from tests.conftest import check_remove_detached, count_kept, tf_macs

L = keras.layers


class TinyConv(keras.layers.Layer):
    """A 'same'-padded 3x3 convolution without bias."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(3, 3, input_shape[-1], self.filters),
                                      initializer="he_normal")

    def call(self, x):
        return keras.ops.conv(x, self.kernel, padding="same")

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.filters,)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters}


class TinyConvHandler(kp.Handler):
    """Channels, costs, rebuild and maskable weights of :class:`TinyConv`."""

    def walk(self, ctx, rec, node, ins):
        out = ctx.new_output(rec, rec.layer.filters)
        pixels = math.prod(output_shape(node)[1:-1])
        ctx.add_kernel(rec, ins[0], out, params=9, macs=9 * pixels)
        return [out]

    def configure(self, rec, config, width):
        return {**config, "filters": width(rec.out_segment)}

    weight_specs = {"kernel": kp.WeightSpec("kernel_constraint", "kernel", in_axis=-2, out_axis=-1)}


kp.register_handler(TinyConv, TinyConvHandler())  # the one place the package learns TinyConv


def _model(seed=0):
    """A stem conv opening a residual stream that TinyConvs write into and read."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((8, 8, 3), name="img")
    stem = L.Conv2D(8, 3, padding="same", name="stem")(x)
    h = L.ReLU(name="relu")(L.BatchNormalization(name="bn")(TinyConv(12, name="tiny1")(stem)))
    h = TinyConv(8, name="tiny2")(h)
    s = L.Add(name="add")([stem, h])
    h = TinyConv(6, name="tiny3")(s)  # reads the stream: a view in prefix mode
    h = L.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(x, L.Dense(3, name="head")(h), name="tiny_net")


def test_profile_counts_the_custom_layer_like_keras_and_tensorflow():
    model = _model()
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    rows = {row.name: row for row in prof.layers}
    assert rows["tiny1"].params == model.get_layer("tiny1").count_params()
    assert rows["tiny1"].prunable and rows["tiny2"].in_variables == rows["tiny1"].out_variables


def test_precrop_rebuilds_the_custom_layer_narrower():
    model = _model()
    small = kp.precrop(model, params=0.5)
    plan = small.precrop_plan
    assert small.count_params() == plan.params == kp.profile(small).total_params
    assert plan.params <= 0.5 * model.count_params()
    assert kp.profile(small).total_macs == tf_macs(small)
    assert isinstance(small.get_layer("tiny1"), TinyConv)
    assert small.get_layer("tiny1").filters < 12
    assert small(np.ones((2, 8, 8, 3), np.float32)).shape == (2, 3)


def test_pai_baselines_score_and_mask_the_custom_kernel():
    model = _model()
    paths = list(pai.prunable_weights(model))
    assert "tiny1/kernel" in paths and "tiny3/kernel" in paths
    n = sum(math.prod(model.get_layer(p.split("/")[0]).kernel.shape) for p in paths)
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(8, 8, 8, 3)).astype("float32"), rng.integers(0, 3, 8))
    for masks in (pai.synflow(model, 0.2, iterations=3, verbose=0), pai.snip(model, data, 0.2),
                  pai.magnitude(model, 0.2)):
        assert set(masks) == set(paths)
        assert count_kept(masks) == round(0.2 * n)


def test_channel_masks_and_detached_weights_follow_the_custom_layer():
    model = _model()
    masks = pai.random_masks(model, 0.3, "channel", seed=1)
    # tiny1's kept output channels pass BN and ReLU: tiny2 reads a nested set of them.
    out1 = masks["tiny1/kernel"].any(axis=(0, 1, 2))
    in2 = masks["tiny2/kernel"].any(axis=(0, 1, 3))
    assert np.all(out1 <= in2) or np.all(in2 <= out1)
    check_remove_detached(model, pai.random_masks(model, 0.05, "weight", seed=2))


@pytest.mark.parametrize("granularity", ["weight", "channel"])
def test_masks_of_the_custom_layer_survive_apply_masks(granularity):
    model = _model()
    masks = pai.random_masks(model, 0.5, granularity, seed=3)
    pai.apply_masks(model, masks)
    kernel = model.get_layer("tiny2").kernel.numpy()
    np.testing.assert_array_equal(kernel[masks["tiny2/kernel"] == 0], 0)


def test_handler_docstring_example_runs():
    """The worked example in ``Handler``'s docstring is correct as written."""
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder(recurse=False).find(kp.Handler, "Handler", globs={}):
        runner.run(test)
    assert runner.tries >= 10 and runner.failures == 0
