"""Tests for ``keras_precrop.profile``: totals, bad input and reports.

Parameter totals are checked against ``model.count_params()`` and MACs against
the convolution and matmul ops of TensorFlow's own traced inference graph
(``tests.conftest.tf_macs``), whose shapes come from
TensorFlow, not from the walker.
"""

import collections
import dataclasses
import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keras import layers as L

import keras_precrop as kp
from keras_precrop import models
from tests.conftest import graph_macs, random_cnns, tf_macs, trace_graph

# Keras seeds new layers' initializers from Python's `random`; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
_HYPOTHESIS = dict(deadline=None, suppress_health_check=list(HealthCheck))

APPLICATIONS = {
    "MobileNetV2": keras.applications.MobileNetV2,
    "EfficientNetB0": keras.applications.EfficientNetB0,
    "ResNet50": keras.applications.ResNet50,
    "DenseNet121": keras.applications.DenseNet121,
    "Xception": keras.applications.Xception,
}
ALL_MODELS = [f"keras.applications.{n}" for n in APPLICATIONS] + models.list()

# Published MACs at 224x224 (issue 2; e.g. the MobileNetV2/EfficientNet papers
# quote 300M and 390M, ResNet-50 is the usual 3.86 GMACs).
KNOWN_MACS = {"MobileNetV2": 300.8e6, "EfficientNetB0": 385.8e6, "ResNet50": 3.858e9}


@pytest.fixture(scope="module")
def build():
    """Builds each named model once per module and frees them afterwards."""
    cache = {}

    def get(name):
        if name not in cache:
            keras.utils.set_random_seed(0)
            prefix = "keras.applications."
            if name.startswith(prefix):
                cache[name] = APPLICATIONS[name[len(prefix):]](weights=None)
            else:
                cache[name] = models.get(name)
        return cache[name]

    yield get
    cache.clear()
    keras.backend.clear_session()


# ---------------------------------------------------------------------------
# Acceptance: totals against Keras and TensorFlow.


@pytest.mark.parametrize("name", ALL_MODELS)
def test_total_params_equal_count_params(build, name):
    model = build(name)
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    # Every row is a flat layer of these models: check them one by one too.
    for row in prof.layers:
        assert row.params == model.get_layer(row.name).count_params(), row.name


@pytest.mark.parametrize("name", ALL_MODELS)
def test_total_macs_equal_tensorflow_graph(build, name):
    model = build(name)
    assert kp.profile(model).total_macs == tf_macs(model)


@pytest.mark.parametrize("name", sorted(KNOWN_MACS))
def test_total_macs_match_published_values(build, name):
    model = build(f"keras.applications.{name}")
    assert tuple(model.inputs[0].shape[1:]) == (224, 224, 3)
    assert kp.profile(model).total_macs == pytest.approx(KNOWN_MACS[name], rel=2e-4)


def test_tf_v1_profiler_counts_two_flops_per_mac(build):
    """``tf.compat.v1.profiler`` reports FLOPs = 2 x MACs for each op type.

    MobileNetV2 has all three: Conv2D (Conv2D layers), DepthwiseConv2dNative
    (DepthwiseConv2D layers) and MatMul (the Dense classifier), so the profile
    summed by layer class must be half the profiler's count for that op type.
    """
    model = build("keras.applications.MobileNetV2")
    graph = trace_graph(model)
    ours = graph_macs(graph)
    by_class = collections.Counter()
    for row in kp.profile(model).layers:
        by_class[row.class_name] += row.macs
    builder = tf.compat.v1.profiler.ProfileOptionBuilder
    for op_type, layer_class in (("Conv2D", "Conv2D"),
                                 ("DepthwiseConv2dNative", "DepthwiseConv2D"),
                                 ("MatMul", "Dense")):
        options = builder(builder.float_operation()).with_empty_output().build()
        options["account_type_regexes"] = [op_type]
        flops = tf.compat.v1.profiler.profile(graph, cmd="op", options=options).total_float_ops
        assert flops > 0
        assert flops == 2 * ours[op_type], op_type
        assert flops == 2 * by_class[layer_class], op_type


def _check_totals(model, residual):
    """Totals equal Keras' and TensorFlow's; a refusal's ignore= remedy works."""
    try:
        prof = kp.profile(model, residual=residual)
    except kp.UnsupportedLayerError as err:
        names = re.findall(r"ignore=\['([^']+)'\]", str(err))
        assert names, f"{err} (no ignore= remedy named)"
        prof = kp.profile(model, residual=residual, ignore=names)
    assert prof.total_params == model.count_params(), model.spec
    assert prof.total_macs == tf_macs(model), model.spec


@settings(max_examples=12, derandomize=True, **_HYPOTHESIS)
@given(model=random_cnns(), residual=st.sampled_from(("prefix", "tie")))
def test_random_cnn_totals_equal_keras_and_tensorflow(model, residual):
    _check_totals(model, residual)


@pytest.mark.slow
@settings(max_examples=300, **_HYPOTHESIS)
@given(model=random_cnns(), residual=st.sampled_from(("prefix", "tie")))
def test_many_random_cnn_totals_equal_keras_and_tensorflow(model, residual):
    _check_totals(model, residual)


def test_graph_reference_counts_by_hand():
    """The reference itself, on a model small enough to count on paper."""
    x = keras.Input((6, 6, 2))
    h = L.Conv2D(4, 3, name="conv")(x)  # 4x4x4 outputs, 3*3*2 MACs each
    h = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same")(h)  # 4x4x8, 9 each
    h = L.Flatten()(h)
    h = L.Dense(5)(h)  # 128 x 5
    x2 = keras.Input((2, 2, 3))
    t = L.Conv2DTranspose(4, 3, strides=2, padding="same")(x2)  # 2*2*3 inputs x 9*4
    model = keras.Model([x, x2], [h, t])
    assert graph_macs(trace_graph(model)) == {
        "Conv2D": 64 * 18, "DepthwiseConv2dNative": 128 * 9, "MatMul": 128 * 5,
        "Conv2DBackpropInput": 12 * 36,
    }
    assert kp.profile(model).total_macs == 64 * 18 + 128 * 9 + 128 * 5 + 12 * 36


# ---------------------------------------------------------------------------
# Bad input.


class _ChannelScale(keras.layers.Layer):
    """A custom layer the walker does not know: one learned scale per channel."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.scale


def _custom_model(scale_class=_ChannelScale, width=8):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(width, 3, padding="same", name="c0")(x)
    h = scale_class(name="scale")(h)
    h = L.Conv2D(4, 3, padding="same", name="c1")(h)
    h = L.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(x, L.Dense(3, name="head")(h))


def _single_layer_model(layer):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(6, 3, padding="same", name="c0")(x)
    h = layer(h)
    h = L.Conv2D(4, 1, name="c1")(h)
    return keras.Model(x, L.GlobalAveragePooling2D(name="gap")(h))


@pytest.mark.parametrize("layer,class_name", [
    (lambda: _ChannelScale(name="odd"), "_ChannelScale"),
    (lambda: L.Permute((2, 1, 3), name="odd"), "Permute"),
    (lambda: L.Lambda(lambda t: t * 2.0, name="odd"), "Lambda"),
])
def test_unsupported_layer_names_layer_class_and_remedies(layer, class_name):
    model = _single_layer_model(layer())
    with pytest.raises(kp.UnsupportedLayerError) as info:
        kp.profile(model)
    message = str(info.value)
    for needle in ("'odd'", class_name, "ignore=['odd']", "register_handler"):
        assert needle in message


@pytest.mark.parametrize("layer", [
    lambda: _ChannelScale(name="odd"),
    lambda: L.Permute((2, 1, 3), name="odd"),
    lambda: L.Lambda(lambda t: t * 2.0, name="odd"),
])
def test_ignored_unsupported_layer_is_an_opaque_block(layer):
    model = _single_layer_model(layer())
    prof = kp.profile(model, ignore=["odd"])
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    rows = {row.name: row for row in prof.layers}
    assert rows["odd"].params == model.get_layer("odd").count_params()
    assert not rows["odd"].prunable
    fixed = {g.name: g.fixed for g in prof.variables}
    # Its input (c0's channels) and its output feeding c1 are both fixed.
    assert fixed[rows["odd"].in_variables[0]] and fixed[rows["c1"].in_variables[0]]
    assert rows["c0"].out_variables == rows["odd"].in_variables


def test_register_handler_teaches_a_custom_layer():
    class TiedScale(_ChannelScale):
        pass

    kp.register_handler(TiedScale, "tie")
    prof = kp.profile(_custom_model(TiedScale))
    rows = {row.name: row for row in prof.layers}
    assert rows["scale"].in_variables == rows["scale"].out_variables == ["c0"]
    assert rows["c1"].in_variables == ["c0"]
    # The per-channel scale shrinks with c0: compare with a model built narrower.
    narrow = _custom_model(TiedScale, width=5)
    widths = [5 if g.name == "c0" else g.width for g in prof.variables]
    params, macs = prof.cost.totals(widths)
    assert (params, macs) == (narrow.count_params(), tf_macs(narrow))


class _NamedScale(_ChannelScale):
    """Registered by its qualified name, the way an optional library's layer is (no import)."""


def test_register_handler_by_qualified_name_and_its_rebuild_with_a_lambda_activation():
    kp.register_handler(f"{__name__}._NamedScale", "tie")
    model = _custom_model(_NamedScale)
    # keras_hub's MobileNetV5 builds Activation(lambda ...): the rebuild reuses the function.
    out = L.Activation(lambda t: t * 0.5, name="half")(model.output)
    model = keras.Model(model.input, out)
    assert kp.profile(model).total_params == model.count_params()
    new = kp.precrop(model, params=0.5)
    assert new.get_layer("scale").weights[0].shape == (new.get_layer("c0").filters,)
    x = np.ones((1, 8, 8, 3), "float32")
    assert np.allclose(new.get_layer("half")(x), 0.5 * x)


def test_register_handler_rejects_unknown_rules():
    with pytest.raises(ValueError, match="'sideways'"):
        kp.register_handler(_ChannelScale, "sideways")
    with pytest.raises(TypeError, match="Handler"):
        kp.register_handler(_ChannelScale, 3)
    with pytest.raises(TypeError, match="layer_class"):
        kp.register_handler(_ChannelScale(), "tie")


class _Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, name="conv")

    def call(self, x):
        return self.conv(x)


def test_subclassed_model_is_traced():
    """A subclassed model is read through its trace (tests/test_trace.py has the full checks)."""
    model = _Subclassed(name="sub")
    model(tf.zeros((1, 8, 8, 3)))
    prof = kp.profile(model)
    assert prof.total_params == model.count_params() == 3 * 3 * 3 * 4 + 4


def test_subclassed_model_inside_functional_is_dissolved_into_its_layers():
    x = keras.Input((8, 8, 3))
    model = keras.Model(x, _Subclassed(name="sub")(x))
    graph = kp.graph.walk(model)
    assert [rec.path for rec in graph.layers] == ["sub_conv"]


def test_undefined_input_shape_is_rejected_with_a_remedy_in_the_inputs_own_shape():
    x = keras.Input((None, None, 3), name="img")
    h = L.Conv2D(4, 3, name="c0")(x)
    model = keras.Model(x, L.GlobalAveragePooling2D()(h))
    with pytest.raises(kp.UnsupportedModelError, match=r"input 'img' has undefined shape \(None, None, "
                       r"None, 3\).*e\.g\. keras\.Input\(\(224, 224, 3\), name='img'\)\.$"):
        kp.profile(model)
    ids = keras.Input((None,), dtype="int32", name="token_ids")  # a text model's open length
    model = keras.Model(ids, L.Dense(4, name="head")(L.Embedding(50, 8, name="embed")(ids)))
    with pytest.raises(kp.UnsupportedModelError, match=r"input 'token_ids' has undefined shape "
                       r"\(None, None\).*a sequence's length.*e\.g\. keras\.Input\(\(128,\), "
                       r"name='token_ids', dtype='int32'\)\.$"):
        kp.profile(model)


def test_unbuilt_sequential_is_rejected():
    model = keras.Sequential([L.Dense(3)], name="seq")
    with pytest.raises(kp.UnsupportedModelError, match="'seq'.*not built.*keras.Input"):
        kp.profile(model)


def test_ignore_of_unknown_layer_is_rejected():
    with pytest.raises(ValueError, match="'nope'"):
        kp.profile(_custom_model(), ignore=["scale", "nope"])


def test_unknown_residual_mode_is_rejected():
    with pytest.raises(ValueError, match="'both'"):
        kp.profile(_single_layer_model(L.ReLU()), residual="both")


def test_add_of_a_concatenation_keeps_its_channels_fixed_with_a_note():
    """A concatenation added to a plain tensor cannot be tied part by part."""
    x = keras.Input((8, 8, 3), name="img")
    a = L.Conv2D(4, 1, name="a")(x)
    b = L.Conv2D(4, 1, name="b")(x)
    cat = L.Concatenate(name="cat")([a, b])
    s = L.Add(name="add")([cat, L.Conv2D(8, 1, name="d")(x)])
    model = keras.Model(x, L.GlobalAveragePooling2D(name="gap")(L.Conv2D(2, 1, name="e")(s)))
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    fixed = {g.name: g.fixed for g in prof.variables}
    assert fixed["a"] and fixed["b"] and fixed["d"]
    assert {row.name: row for row in prof.layers}["e"].in_variables == ["a", "b"]
    assert len(prof.notes) == 1 and prof.notes[0].startswith("add:")
    lines = []
    prof.summary(print_fn=lines.append)
    assert f"Note: {prof.notes[0]}" in lines
    assert prof.to_dict()["notes"] == prof.notes


# Library bug: the error below tells the user to pass ignore=[name], but an
# ignored layer of a *supported* class still goes through its handler, which
# raises the same error again. (Grouped convolutions honour ignore= and pass.)


def test_ignore_suggested_for_channel_moving_reshape_works():
    x = keras.Input((8, 8, 3), name="img")
    h = L.Reshape((8, 4, 8), name="rs")(L.Conv2D(4, 1, name="a")(x))
    model = keras.Model(x, L.Conv2D(2, 1, name="e")(h))
    with pytest.raises(kp.UnsupportedLayerError, match=re.escape("ignore=['rs']")):
        kp.profile(model)
    prof = kp.profile(model, ignore=["rs"])
    assert prof.total_params == model.count_params()


def test_ignore_works_for_grouped_convolution():
    x = keras.Input((8, 8, 4), name="img")
    h = L.Conv2D(4, 1, groups=2, name="g")(x)
    model = keras.Model(x, L.Conv2D(2, 1, name="e")(h))
    for ignore in ([], ["g"]):
        prof = kp.profile(model, ignore=ignore)
        assert prof.total_params == model.count_params()
        # 64 pixels x (4 outputs x 2 inputs per group) for g, 64 x 4 x 2 for e.
        assert prof.total_macs == 64 * 8 + 64 * 8 == tf_macs(model)
    assert not next(r for r in kp.profile(model, ignore=["g"]).layers if r.name == "g").prunable


# ---------------------------------------------------------------------------
# Reports.


def test_summary_prints_every_costly_layer_and_the_totals(build):
    prof = kp.profile(build("resnet20"))
    lines = []
    prof.summary(print_fn=lines.append)
    text = "\n".join(lines)
    costly = [row for row in prof.layers if row.params or row.macs]
    assert costly and len(costly) < len(prof.layers)
    for row in costly:
        assert f"{row.name} ({row.class_name})" in text
        assert f"{row.params:,}" in text
    for row in prof.layers:
        if not (row.params or row.macs):
            assert f"{row.name} ({row.class_name})" not in text
    assert f"{prof.total_params:,}" in text and f"{prof.total_macs:,}" in text
    assert f"{2 * prof.total_macs:,} FLOPs" in text
    assert not prof.notes and "Note:" not in text
    # The hidden layers are counted: Keras' layers without weights, but for the input.
    model = build("resnet20")
    free = [layer for layer in model.layers
            if layer.count_params() == 0 and not isinstance(layer, keras.layers.InputLayer)]
    assert len(free) == len(prof.layers) - len(costly) > 1
    assert f"{len(free)} layers without params or MACs not shown (only_costly=False shows " \
           "them)." in lines
    everything = []
    prof.summary(print_fn=everything.append, only_costly=False)
    for row in prof.layers:
        assert any(f"{row.name} ({row.class_name})" in line for line in everything)
    assert not any("not shown" in line for line in everything)


def test_to_dict_is_json_and_consistent(build):
    prof = kp.profile(build("resnet20"))
    data = json.loads(json.dumps(prof.to_dict()))
    assert data["model"] == "resnet20"
    assert "MAC" in data["units"] and "FLOPs = 2 x MACs" in data["units"]
    assert (data["total_params"], data["total_macs"]) == (prof.total_params, prof.total_macs)
    assert data["notes"] == prof.notes
    assert data["layers"] == [dataclasses.asdict(row) for row in prof.layers]
    assert sum(row["params"] for row in data["layers"]) == prof.total_params
    assert sum(row["macs"] for row in data["layers"]) == prof.total_macs
    assert len(data["variables"]) == len(prof.variables)
    for entry, group in zip(data["variables"], prof.variables):
        assert (entry["name"], entry["width"], entry["fixed"], entry["kind"]) == (
            group.name, group.width, group.fixed, group.kind)
        bound = None if group.bound is None else prof.variables[group.bound].name
        assert entry["bound"] == bound
        assert entry["layers"] == group.layers


def test_prunable_flags(build):
    prof = kp.profile(build("resnet20"))
    fixed = {g.name: g.fixed for g in prof.variables}
    for row in prof.layers:
        names = set(row.in_variables + row.out_variables)
        has_weights = row.params > 0
        expected = has_weights and any(not fixed[n] for n in names)
        assert row.prunable == expected, row.name
    # The model input (RGB) and output (logits) groups are never prunable.
    assert fixed[prof.layers[0].in_variables[0]]
    assert fixed[prof.layers[-1].out_variables[0]]
