"""``keras.ops.reshape(s, (-1, 1, 1, C))`` in a squeeze-and-excitation block (issue 42).

It must leave the block's channels prunable exactly as a ``Reshape`` layer
does (the reference: the same model written with ``layers.Reshape``), and the
rebuilt model's reshape must use the new width (the reference: a forward
pass of the rebuilt model and Keras' parameter count).
"""

import keras
import numpy as np
from keras import ops

import keras_precrop as kp
from tests.conftest import L


def _se_model(use_op):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(16, 3, padding="same", activation="relu", name="c0")(x)
    s = L.GlobalAveragePooling2D(name="squeeze")(h)
    s = L.Dense(4, activation="relu", name="se_reduce")(s)
    s = L.Dense(16, activation="sigmoid", name="se_expand")(s)
    s = ops.reshape(s, (-1, 1, 1, 16)) if use_op else L.Reshape((1, 1, 16), name="se_shape")(s)
    h = L.Multiply(name="excite")([h, s])
    h = L.Conv2D(8, 3, padding="same", name="c1")(h)
    return keras.Model(x, L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(h)))


def _prunable_widths(prof):
    return sorted((g.width, g.fixed) for g in prof.variables)


def test_an_op_reshape_in_an_se_block_leaves_its_channels_prunable_like_a_reshape_layer():
    with_op, with_layer = _se_model(True), _se_model(False)
    assert _prunable_widths(kp.profile(with_op)) == _prunable_widths(kp.profile(with_layer))
    plan_op, plan_layer = kp.plan(with_op, params=0.5), kp.plan(with_layer, params=0.5)
    assert sorted(plan_op.widths.values()) == sorted(plan_layer.widths.values())
    assert plan_op.params == plan_layer.params and plan_op.macs == plan_layer.macs
    new = kp.apply_plan(with_op, plan_op)
    assert new.count_params() == plan_op.params
    width = new.get_layer("c0").filters
    assert width < 16
    reshaped = [t for t in keras.tree.flatten([n.outputs for op in new.operations
                                               for n in op._inbound_nodes])
                if tuple(t.shape[1:3]) == (1, 1)]
    assert reshaped and all(t.shape[-1] == width for t in reshaped)
    out = new(np.ones((2, 8, 8, 3), "float32"))
    assert out.shape == (2, 3)
