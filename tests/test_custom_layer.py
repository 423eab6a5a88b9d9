"""A custom layer with a kernel, taught to the package by one handler in one place.

``TinyConv`` is a convolution written from ``keras.ops`` (not a subclass of a
Keras conv layer, so nothing built in knows it). Registering
``TinyConvHandler`` is all it takes for profiling, PreCrop (solve and
rebuild) and the pruning-at-initialization baselines to handle it; each is
checked against an independent reference (Keras' parameter count,
TensorFlow's graph MACs, synaptic flow, forward passes, and the pruners'
scores recomputed with a ``GradientTape`` to check which weights they keep).
"""

import doctest
import math

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import pai
from keras_precrop.graph import output_shape
from tests.conftest import assert_matches_plan, check_remove_detached, count_kept, tf_macs

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
    assert_matches_plan(model, plan, small)  # Keras' params, TF's MACs, every width as planned


def _kernels(model):
    """``{path: kernel variable}`` of every layer with a kernel, read off the layers (not ``pai``)."""
    return {f"{layer.name}/kernel": layer.kernel for layer in model.layers if hasattr(layer, "kernel")}


def _weight_scores(model, objective):
    """``|w * d objective / dw|`` of every kernel, by TensorFlow's ``GradientTape``."""
    import tensorflow as tf

    kernels = _kernels(model)
    with tf.GradientTape() as tape:
        value = objective(model)
    grads = tape.gradient(value, [v.value for v in kernels.values()])
    return {path: np.abs(v.numpy() * g.numpy()) for (path, v), g in zip(kernels.items(), grads)}


def _snip_reference(model, x, y):
    """SNIP's connection sensitivity ``|w * dL/dw|`` on the batch, the model in inference mode."""
    return _weight_scores(model, lambda m: keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
        y, m(x, training=False), from_logits=True)))


def _synflow_reference(model, masks=None):
    """SynFlow's ``|w * dR/dw|``: a copy with every weight and BN statistic replaced by its absolute
    value (and masked kernels zeroed), ``R`` the sum of its outputs on an all-ones input."""
    linear = keras.models.clone_model(model)
    linear.set_weights([np.abs(w) for w in model.get_weights()])
    for path, kernel in _kernels(linear).items():
        if masks is not None:
            kernel.assign(kernel.numpy() * masks[path])
    ones = np.ones((1, *model.input.shape[1:]), np.float32)
    return _weight_scores(linear, lambda m: keras.ops.sum(m(ones, training=False)))


def _assert_kept_outscore_pruned(masks, scores, among=None, rtol=1e-5):
    """Every kept weight scores at least every pruned one (``among``: of these weights only), up to
    float32 rounding between two computations of the same score (ties and near-ties aside)."""
    kept, pruned = [], []
    for path, mask in masks.items():
        candidates = np.ones(mask.shape, bool) if among is None else among[path] > 0
        kept.append(scores[path][(mask > 0) & candidates])
        pruned.append(scores[path][(mask == 0) & candidates])
    kept, pruned = np.concatenate(kept), np.concatenate(pruned)
    assert kept.size and pruned.size
    assert kept.min() >= pruned.max() * (1 - rtol), (kept.min(), pruned.max())


_DENSITY = 0.2


@pytest.mark.parametrize("pruner", ["magnitude", "snip", "synflow"])
def test_pai_baselines_keep_the_best_scored_weights_of_the_custom_kernel(pruner):
    """Which weights survive, not only how many: magnitude keeps exactly the largest ``|w|``;
    SNIP and (single-shot and iterative) SynFlow keep weights scoring at least every pruned one,
    by scores computed here with a ``GradientTape``; and the masks hold through ``fit``."""
    model = _model()
    kernels = _kernels(model)
    assert {"tiny1/kernel", "tiny2/kernel", "tiny3/kernel"} <= set(kernels)
    n = sum(math.prod(v.shape) for v in kernels.values())
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 8, 8, 3)).astype("float32"), rng.integers(0, 3, 8)
    if pruner == "magnitude":
        masks = pai.magnitude(model, _DENSITY)
        scores = {path: np.abs(v.numpy()) for path, v in kernels.items()}
        rtol = 0.0  # the very same numbers
    elif pruner == "snip":
        masks = pai.snip(model, (x, y), _DENSITY)
        scores, rtol = _snip_reference(model, x, y), 1e-4
    else:
        masks = pai.synflow(model, _DENSITY, iterations=1, verbose=0)
        scores, rtol = _synflow_reference(model), 1e-4
    assert set(masks) == set(kernels)
    assert count_kept(masks) == round(_DENSITY * n)
    _assert_kept_outscore_pruned(masks, scores, rtol=rtol)
    if pruner == "synflow":
        # Iterative: round k prunes to density ** (k / 3) among the survivors of round k - 1, by
        # the scores of the network with the pruned weights zeroed; pruned weights never return.
        masks = pai.synflow(model, _DENSITY, iterations=3, verbose=0)
        before = pai.synflow(model, _DENSITY ** (2 / 3), iterations=2, verbose=0)
        assert count_kept(masks) == round(_DENSITY * n)
        assert all(np.all(masks[p] <= before[p]) for p in masks)
        _assert_kept_outscore_pruned(masks, _synflow_reference(model, before), among=before, rtol=rtol)

    # Masked training: pruned weights stay exactly zero through fit (SGD with momentum and weight
    # decay, two steps), while the kept ones train.
    pai.apply_masks(model, masks)
    start = {path: v.numpy().copy() for path, v in kernels.items()}
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for path, v in kernels.items():
        after = v.numpy()
        np.testing.assert_array_equal(after[masks[path] == 0], 0, err_msg=path)
        assert not np.array_equal(after[masks[path] > 0], start[path][masks[path] > 0]), path


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
