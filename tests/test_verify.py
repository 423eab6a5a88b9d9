"""apply_plan never returns a model that disagrees with its plan.

The check walks the rebuilt model afresh; these tests corrupt plans on
purpose and rebuild NASNet-like cells (the pattern that once produced wrong
models) and compare with Keras' and TensorFlow's own counts.
"""

import json
import re

import keras
import numpy as np
import pytest
from keras import layers as L

import keras_precrop as kp
from keras_precrop import verify
from keras_precrop.graph import rebuild, walk
from tests.conftest import tf_macs


def _chain():
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(8, 3, padding="same", name="stem")(x)
    y = L.Conv2D(12, 3, padding="same", name="c1")(h)
    y = L.Conv2D(8, 3, padding="same", name="c2")(L.ReLU(name="r1")(y))
    h = L.Add(name="add")([h, y])
    h = L.Conv2D(10, 1, name="c3")(h)
    out = L.Dense(4, name="head")(L.GlobalAveragePooling2D(name="gap")(h))
    return keras.Model(x, out, name="chain")


def _corrupt(plan, edit):
    data = json.loads(plan.to_json())
    edit(data)
    return kp.Plan.from_dict(data)


def test_corrupted_group_width_names_the_layer():
    model = _chain()
    plan = kp.plan(model, params=0.5)
    assert plan.widths["c1"] > 1

    def shrink_c1(data):
        next(g for g in data["variables"] if g["name"] == "c1")["new"] -= 1

    with pytest.raises(kp.RebuildMismatchError, match=re.escape("layer 'c1' has")) as err:
        kp.apply_plan(model, _corrupt(plan, shrink_c1))
    assert isinstance(err.value, kp.PlanMismatchError)
    # Both values, the rebuilt one first: c1 lost one filter's weights and bias.
    planned = next(row for row in plan.layers if row["name"] == "c1")["params_new"]
    per_filter = planned // plan.widths["c1"]
    assert (f"has {planned - per_filter:,} parameters; the plan predicts {planned:,}"
            in str(err.value))


def _bump_c2_macs(data):
    next(layer for layer in data["layers"] if layer["name"] == "c2")["macs_new"] += 1


def _bump_total_params(data):
    data["predicted"]["params"] += 3


@pytest.mark.parametrize("edit,match", [
    (_bump_c2_macs, "layer 'c2' has .* MACs; the plan predicts"),
    (_bump_total_params, "in total; the plan predicts"),
])
def test_corrupted_recorded_costs_are_caught(edit, match):
    model = _chain()
    plan = kp.plan(model, params=0.5, flops=0.6)
    with pytest.raises(kp.RebuildMismatchError, match=match):
        kp.apply_plan(model, _corrupt(plan, edit))


def test_a_writer_wider_than_its_stream_is_refused():
    """A hand-edited plan that widens a writer past its stream cannot slip through."""
    model = _chain()
    plan = kp.plan(model, params=0.6)

    def widen_writer(data):
        groups = {g["name"]: g for g in data["variables"]}
        groups["stem"]["new"] = 3  # the stream; its writer c2 keeps its width
        assert groups["c2"]["new"] > 3

    with pytest.raises(kp.RebuildMismatchError, match="layer '(stem|c1|c2|add)'"):
        kp.apply_plan(model, _corrupt(plan, widen_writer))


def _nasnet_like_cell():
    """A NASNet normal cell's residual pattern, small.

    ``p`` (a projection, like ``adjust_conv_projection``) and ``h`` (the
    cell's 1x1 conv) are added in ``add_3``; ``add_5`` adds ``h`` to a
    separable branch, so neither of ``add_5``'s inputs is the stream's
    creator; ``p`` also goes through NASNet's padding/cropping path.
    """
    x = keras.Input((9, 9, 5), name="img")
    prev = L.Conv2D(12, 1, name="prev")(x)
    p = L.Conv2D(8, 1, name="p")(L.ReLU(name="relu_p")(prev))
    p = L.BatchNormalization(name="bn_p")(p)
    h = L.Conv2D(8, 1, name="h")(L.ReLU(name="relu_h")(x))
    x1 = L.Add(name="add_1")([L.SeparableConv2D(8, 3, padding="same", name="sep_1")(h),
                             L.SeparableConv2D(8, 3, padding="same", name="sep_2")(p)])
    x3 = L.Add(name="add_3")([L.AveragePooling2D(3, 1, padding="same", name="avg")(h), p])
    x4 = L.Add(name="add_4")([L.AveragePooling2D(3, 1, padding="same", name="avg_a")(p),
                             L.AveragePooling2D(3, 1, padding="same", name="avg_b")(p)])
    x5 = L.Add(name="add_5")([L.SeparableConv2D(8, 3, padding="same", name="sep_5")(h), h])
    shifted = L.Cropping2D(((1, 0), (1, 0)), name="crop")(L.ZeroPadding2D(((0, 1), (0, 1)),
                                                                           name="pad")(p))
    side = L.Conv2D(6, 1, name="side")(L.AveragePooling2D(1, name="avg_s")(shifted))
    out = L.Concatenate(name="cat")([p, x1, x3, x4, x5, side])
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(out))
    return keras.Model(x, out, name="nasnet_like")


def _check_rebuilt(model, plan, new):
    """Counts of the rebuilt model from Keras and TensorFlow, against the plan."""
    assert new.count_params() == plan.params
    assert tf_macs(new) == plan.macs
    for key, ratio in (("params", plan.budgets["params"]), ("macs", plan.budgets["macs"])):
        if ratio is not None:
            assert plan.predicted[key] <= ratio
    x = np.random.default_rng(0).normal(size=(2,) + tuple(model.input_shape[1:]))
    assert new(x).shape == model(x).shape


@pytest.mark.parametrize("params,flops", [(0.3, None), (0.5, None), (None, 0.5), (0.7, 0.6)])
def test_nasnet_like_cell_rebuilds_as_planned(params, flops):
    model = _nasnet_like_cell()
    plan = kp.plan(model, params, flops)
    new = kp.apply_plan(model, plan)
    _check_rebuilt(model, plan, new)
    # Every add comes out as wide as the stream the plan gave it.
    for name in ("add_3", "add_4", "add_5"):
        layer = next(row for row in plan.layers if row["name"] == name)
        assert new.get_layer(name).output.shape[-1] == int(layer["channels_new"])
    # add_5 has no other input as wide as the stream: h is tied to p.
    assert new.get_layer("h").filters == new.get_layer("p").filters


@pytest.mark.slow
@pytest.mark.parametrize("params,flops", [(0.5, None), (0.3, None), (None, 0.5)])
def test_nasnet_mobile_rebuilds_as_planned(params, flops):
    model = keras.applications.NASNetMobile(input_shape=(96, 96, 3), weights=None)
    plan = kp.plan(model, params, flops)
    new = kp.apply_plan(model, plan)
    _check_rebuilt(model, plan, new)
    assert kp.profile(new).total_params == plan.params


def test_check_walks_the_rebuilt_model_once(monkeypatch):
    """The check costs one walk of the rebuilt model and no forward pass."""
    model = _nasnet_like_cell()
    plan = kp.plan(model, params=0.5)
    graph = walk(model, residual=plan.residual)
    widths = [plan.widths[v.name] for v in graph.variables]
    new = rebuild(graph, widths)
    walked = []
    real_walk = verify._graph.walk
    monkeypatch.setattr(verify._graph, "walk", lambda m, **kw: walked.append(m) or real_walk(m, **kw))
    monkeypatch.setattr(type(new), "__call__", lambda *a, **kw: pytest.fail("the check ran the model"))
    assert verify.check(new, graph, widths, plan)[1] is None
    assert walked == [new]
