"""Grouped convolutions and the layer/op vocabulary of modern CNNs.

Every model here is profiled against ``count_params()`` and TensorFlow's
traced graph, planned, rebuilt and compared with the plan (Keras' counts,
TensorFlow's MACs, each layer's ``filters``/``units``).
"""

import re

import keras
import numpy as np
import pytest
from keras import layers as L
from keras.src.applications.convnext import LayerScale
from keras.src.applications.inception_resnet_v2 import CustomScaleLayer

import keras_precrop as kp
from tests.conftest import assert_budget_use, assert_matches_plan, tf_macs


def _head(x, inputs, name):
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(x))
    return keras.Model(inputs, out, name=name)


def _check(model, budgets=((0.5, None), (None, 0.4), (0.8, 1.0)), round_to=1, **options):
    prof = kp.profile(model, **options)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    plans = []
    for params, flops in budgets:
        upper = None if flops == 1.0 else 1.0
        plan = kp.plan(model, params, flops, upper=upper, round_to=round_to, **options)
        new = kp.apply_plan(model, plan)
        assert_matches_plan(model, plan, new)
        assert_budget_use(plan, model, upper, round_to=round_to)
        plans.append((plan, new))
    return plans


@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_style_grouped_conv_follows_its_input(multiplier):
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(12, 1, name="expand")(x)
    x = L.Conv2D(12 * multiplier, 3, padding="same", groups=12, name="dw")(x)
    x = L.Conv2D(8, 1, name="project")(x)
    for _plan, new in _check(_head(x, inputs, "dw_style")):
        expand = new.get_layer("expand").filters
        assert new.get_layer("dw").groups == expand
        assert new.get_layer("dw").filters == multiplier * expand


@pytest.mark.parametrize("groups,round_to", [(4, 1), (3, 1), (4, 8)])
def test_grouped_conv_widths_move_in_multiples_of_groups(groups, round_to):
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(8 * groups, 1, name="a")(x)
    x = L.Conv2D(8 * groups, 3, padding="same", groups=groups, name="g")(x)
    x = L.Conv2D(4 * groups, 1, groups=groups, name="g2")(x)
    x = L.Conv2D(10, 1, name="c")(x)
    step = np.lcm(groups, round_to)
    plans = _check(_head(x, inputs, "resnext_like"), round_to=round_to)
    for _plan, new in plans:
        for name in ("a", "g", "g2"):
            layer = new.get_layer(name)
            assert layer.filters % step == 0, (name, layer.filters)
        assert new.get_layer("g").groups == groups
    assert plans[-1][0].widths["g"] != 8 * groups  # widths did move


def test_group_normalization_keeps_its_group_count():
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(24, 3, name="a")(x)
    x = L.GroupNormalization(groups=4, name="gn")(x)
    x = L.Conv2D(16, 1, name="b")(x)
    x = L.GroupNormalization(groups=-1, name="instance")(x)  # one channel per group
    x = L.LayerNormalization(name="ln")(x)
    x = L.Activation("gelu", name="gelu")(x)
    for _plan, new in _check(_head(x, inputs, "norms")):
        assert new.get_layer("gn").groups == 4
        assert new.get_layer("a").filters % 4 == 0
        assert new.get_layer("instance").groups == new.get_layer("b").filters


def test_convnext_and_inception_resnet_layers():
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(16, 2, strides=2, name="stem")(x)
    y = L.Conv2D(16, 3, padding="same", groups=16, name="dw")(x)
    y = L.LayerNormalization(epsilon=1e-6, name="ln")(y)
    y = L.Conv2D(32, 1, name="pw1")(y)
    y = L.Activation("gelu", name="gelu")(y)
    y = L.Conv2D(16, 1, name="pw2")(y)
    y = LayerScale(1e-6, 16, name="layer_scale")(y)
    x = L.Add(name="add")([x, y])
    r = L.Conv2D(16, 1, name="branch")(x)
    x = CustomScaleLayer(0.17, name="scale")([x, r])
    plans = _check(_head(x, inputs, "modern"))
    new = plans[0][1]
    assert new.get_layer("layer_scale").gamma.shape == (new.get_layer("pw2").filters,)


def test_keras_ops_nodes_have_channel_rules():
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", name="a")(x)
    y = keras.ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = L.Conv2D(6, 3, name="b")(y)
    y = keras.ops.concatenate([y, x], axis=-1)
    gate = keras.ops.sigmoid(keras.ops.mean(y, axis=(1, 2), keepdims=True))
    y = keras.ops.multiply(y, gate)
    z = keras.ops.reshape(L.GlobalAveragePooling2D(name="pool")(y), (-1, 1, 1, 14))
    z = keras.ops.squeeze(L.Conv2D(5, 1, name="c")(z), axis=(1, 2))
    z = keras.ops.expand_dims(keras.ops.expand_dims(z, 1), 1)
    x = keras.ops.add(L.Conv2D(5, 1, name="d")(y), z)
    x = L.Conv2D(32, 3, padding="same", name="wide")(x)
    model = _head(x, inputs, "ops")
    # The reshape spells out its 14 channels, as a Reshape layer's target does: they flow
    # through (issue 42), and the rebuilt reshape spells out the new count.
    assert not any("reshape to a fixed shape" in note for note in kp.profile(model).notes)
    for _plan, new in _check(model, budgets=((0.8, None), (None, 0.8), (0.9, 1.0))):
        assert new.get_layer("wide").filters < 32
        assert new.get_layer("c").kernel.shape[-2] == (new.get_layer("b").filters
                                                       + new.get_layer("a").filters)


@pytest.mark.parametrize("op,what", [
    (lambda x: keras.ops.pad(x, ((0, 0), (0, 0), (0, 0), (0, 2))), "pads the channel axis"),
    (lambda x: keras.ops.mean(x, axis=-1, keepdims=True), "reduces or moves the channel axis"),
    (lambda x: keras.ops.reshape(x, (-1, 8, 4, 8)), "moves channels to other axes"),
    (lambda x: keras.ops.transpose(x, (0, 3, 1, 2)), "is not supported"),
])
def test_ops_the_walker_cannot_reason_about_are_refused_by_name(op, what):
    x = inputs = keras.Input((8, 8, 3))
    y = op(L.Conv2D(4, 1, name="a")(x))
    model = _head(L.Conv2D(2, 1, name="e")(y), inputs, "refused")
    name = next(op.name for op in model.operations
                if not isinstance(op, (keras.layers.Layer, keras.Model)))
    with pytest.raises(kp.UnsupportedLayerError, match=re.escape(what)) as err:
        kp.profile(model)
    assert name in str(err.value)
    prof = kp.profile(model, ignore=[name])  # the named remedy works
    assert prof.total_params == model.count_params()
