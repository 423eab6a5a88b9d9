"""Subclassed models and composite layers, traced into functional graphs (issue 28).

Each model is written the way users write them (blocks as ``Layer``
subclasses with ``training`` flags, sublayers named alike in every block) and
checked against independent references: Keras' ``count_params()``, the MACs
of TensorFlow's own trace of the model's ``call``, a forward pass with the
original's weights, ``fit`` for a step and a ``.keras`` round trip.
"""

import keras
import numpy as np
import pytest
from keras import layers as L
from keras import ops

import keras_precrop as kp
from keras_precrop.graph import trace
from tests.conftest import assert_matches_plan, tf_macs

# -- models as users write them -------------------------------------------------


class ResidualBlock(L.Layer):
    """conv-BN-relu-conv-BN + shortcut (a 1x1 projection when the shape changes)."""

    def __init__(self, filters, stride=1, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.stride = filters, stride
        self.conv1 = L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                              name="conv1")
        self.bn1 = L.BatchNormalization(name="bn1")
        self.conv2 = L.Conv2D(filters, 3, padding="same", use_bias=False, name="conv2")
        self.bn2 = L.BatchNormalization(name="bn2")

    def build(self, input_shape):
        self.proj = None
        if self.stride != 1 or input_shape[-1] != self.filters:
            self.proj = L.Conv2D(self.filters, 1, strides=self.stride, name="proj")

    def call(self, x, training=None):
        y = ops.relu(self.bn1(self.conv1(x), training=training))
        y = self.bn2(self.conv2(y), training=training)
        shortcut = x if self.proj is None else self.proj(x)
        return ops.relu(y + shortcut)


class ResNet(keras.Model):
    def __init__(self, num_classes=10, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, padding="same", name="stem")
        self.stages = [ResidualBlock(8, name="block1"), ResidualBlock(8, name="block2"),
                       ResidualBlock(16, stride=2, name="block3")]
        self.pool = L.GlobalAveragePooling2D()
        self.head = L.Dense(num_classes, name="head")

    def call(self, x, training=None):
        x = ops.relu(self.stem(x))
        for block in self.stages:
            x = block(x, training=training)
        return self.head(self.pool(x))


class SqueezeExcite(L.Layer):
    def __init__(self, channels, ratio=0.25, **kwargs):
        super().__init__(**kwargs)
        self.reduce = L.Conv2D(max(1, int(channels * ratio)), 1, activation="relu")
        self.expand = L.Conv2D(channels, 1, activation="sigmoid")

    def call(self, x):
        return x * self.expand(self.reduce(ops.mean(x, axis=(1, 2), keepdims=True)))


class InvertedResidual(L.Layer):
    def __init__(self, in_channels, out_channels, expansion=4, stride=1, **kwargs):
        super().__init__(**kwargs)
        hidden = in_channels * expansion
        self.residual = stride == 1 and in_channels == out_channels
        self.expand = L.Conv2D(hidden, 1, use_bias=False)
        self.bn0 = L.BatchNormalization()
        self.depthwise = L.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False)
        self.bn1 = L.BatchNormalization()
        self.se = SqueezeExcite(hidden)
        self.project = L.Conv2D(out_channels, 1, use_bias=False)
        self.bn2 = L.BatchNormalization()

    def call(self, x, training=None):
        y = ops.relu6(self.bn0(self.expand(x), training=training))
        y = self.se(ops.relu6(self.bn1(self.depthwise(y), training=training)))
        y = self.bn2(self.project(y), training=training)
        return x + y if self.residual else y


class MobileNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, strides=2, padding="same")
        self.blocks = [InvertedResidual(8, 8), InvertedResidual(8, 16, stride=2),
                       InvertedResidual(16, 16)]
        self.head = L.Dense(10)

    def call(self, x, training=None):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, training=training)
        return self.head(ops.mean(x, axis=(1, 2)))


class Inner(L.Layer):
    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(filters, 3, padding="same")
        self.norm = L.BatchNormalization()

    def call(self, x, training=None):
        return ops.relu(self.norm(self.conv(x), training=training))


class Mid(L.Layer):
    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.first, self.second = Inner(filters), Inner(filters)

    def call(self, x, training=None):
        return self.second(self.first(x, training=training), training=training)


class Outer(L.Layer):
    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.mid = Mid(filters)
        self.skip = L.Conv2D(filters, 1)

    def call(self, x, training=None):
        return self.mid(x, training=training) + self.skip(x)


def _resnet():
    model = ResNet(name="resnet")
    model(np.zeros((1, 16, 16, 3), "float32"))
    return model


def _mobilenet():
    model = MobileNet(name="mobilenet")
    model(np.zeros((1, 32, 32, 3), "float32"))
    return model


def _nested():
    """A functional model holding a composite nested three deep (Outer > Mid > Inner)."""
    x = keras.Input((16, 16, 3))
    h = Outer(12, name="outer")(L.Conv2D(8, 3, name="stem")(x))
    h = Outer(16, name="outer_2")(h)
    return keras.Model(x, L.Dense(5, name="head")(L.GlobalAveragePooling2D()(h)), name="nested")


MODELS = {"resnet": _resnet, "mobilenet": _mobilenet, "nested": _nested}


def _randomize(model):
    """Random weights and BN statistics, so that a wrong copy shows in the outputs."""
    rng = np.random.default_rng(0)
    for w in model.weights:
        value = rng.standard_normal(w.shape).astype("float32") * 0.3
        w.assign(np.abs(value) + 0.5 if "variance" in w.path else value)


def _input(model):
    shape = trace.traced(model).functional.inputs[0].shape
    return np.random.default_rng(1).standard_normal((2,) + tuple(shape[1:])).astype("float32")


def _numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


# -- the checks -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_profile_counts_match_keras_and_tensorflow(name):
    model = MODELS[name]()
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    if keras.backend.backend() == "tensorflow":  # tests/test_backends.py runs this file without it
        assert prof.total_macs == tf_macs(model)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_precrop_and_reconfigure_give_the_planned_models(name):
    model = MODELS[name]()
    for new in (kp.precrop(model, params=0.5), kp.precrop(model, flops=0.5),
                kp.reconfigure(model, params=0.8, flops=1.0)):
        assert_matches_plan(model, new.precrop_plan, new)
        assert new.count_params() < model.count_params() or new.precrop_plan.mode != "exact"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_identity_plan_reproduces_the_original_outputs(name):
    """All widths kept, the original's weights copied by the place names: the same function."""
    model = MODELS[name]()
    _randomize(model)
    new = kp.precrop(model, params=1.0)
    assert new.count_params() == model.count_params()
    traced = trace.traced(model)
    for layer in traced.functional.layers:
        if layer.weights:
            new.get_layer(traced.name(layer)).set_weights(layer.get_weights())
    x = _input(model)
    np.testing.assert_allclose(_numpy(new(x, training=False)), _numpy(model(x, training=False)),
                               atol=1e-5)


def test_traced_names_say_where_each_layer_came_from_and_the_model_is_untouched():
    model = _resnet()
    before = [layer.name for layer in model._flatten_layers()]
    new = kp.precrop(model, params=0.5)
    names = {layer.name for layer in new.layers}
    assert {"stem", "block1_conv1", "block2_conv1", "block3_proj", "block3_bn2", "head"} <= names
    assert [layer.name for layer in model._flatten_layers()] == before
    lines = []
    kp.profile(model).summary(print_fn=lines.append)
    assert "block3_conv1" in "\n".join(lines)


def test_a_traced_functional_model_keeps_its_graph_outputs_and_layer_outputs():
    """Tracing reuses the model's own layers, so each records one more call, as any second call of a
    layer does in Keras; the model's config, outputs and ``get_layer(...).output`` stay the same."""
    model = _nested()
    _randomize(model)
    x = _input(model)
    config, outputs = model.get_config(), _numpy(model(x, training=False))
    stem = _numpy(keras.Model(model.input, model.get_layer("stem").output)(x))
    kp.precrop(model, params=0.5)
    assert trace.traced(model).functional is not model  # the composites were dissolved
    assert model.get_config() == config
    np.testing.assert_array_equal(_numpy(model(x, training=False)), outputs)
    np.testing.assert_array_equal(_numpy(keras.Model(model.input, model.get_layer("stem").output)(x)),
                                  stem)


def test_pruned_traced_model_trains_saves_and_reloads(tmp_path):
    model = _mobilenet()
    new = kp.precrop(model, flops=0.5)
    new.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = _input(model)
    new.fit(x, np.array([1, 2]), epochs=1, verbose=0)
    path = tmp_path / "pruned.keras"
    new.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(_numpy(loaded(x, training=False)), _numpy(new(x, training=False)),
                               atol=1e-6)


def test_ignore_names_a_layer_inside_a_block():
    model = _resnet()
    new = kp.precrop(model, params=0.5, ignore=["block2_conv1"])
    assert new.get_layer("block2_conv1").filters == 8


class Branchy(L.Layer):
    """A Python branch on a tensor's value: no graph can say which way it goes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, padding="same")

    def call(self, x):
        if ops.mean(x) > 0:
            return self.conv(x)
        return self.conv(-x)


class BranchyNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(4, 3, name="stem")
        self.branchy = Branchy(name="branchy")
        self.head = L.Dense(2)

    def build(self, input_shape):
        self.stem.build(input_shape)
        self.branchy.conv.build(self.stem.compute_output_shape(input_shape))
        self.head.build((None, 4))

    def call(self, x):
        return self.head(ops.mean(self.branchy(self.stem(x)), axis=(1, 2)))


def test_python_branch_on_a_tensor_value_is_refused_with_the_layer_name():
    model = BranchyNet(name="branchy_net")
    model(np.ones((1, 8, 8, 3), "float32"))  # eager: the branch is taken once
    with pytest.raises(kp.UnsupportedLayerError, match=r"(?s)'branchy' of class Branchy branches in "
                       r"Python on a tensor's value.*keras.ops.where") as info:
        kp.profile(model)
    assert "ignore" not in info.value.arguments  # kept whole, it cannot run symbolically either


def test_unbuilt_subclassed_model_is_refused_clearly():
    with pytest.raises(kp.UnsupportedModelError, match="is not built.*model.build"):
        kp.profile(ResNet(name="fresh"))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a tf.* function")
def test_tensorflow_function_in_call_is_refused_and_ignore_keeps_the_block_whole():
    import tensorflow as tf

    class TfBlock(L.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = L.Conv2D(4, 3, padding="same")

        def call(self, x):
            return tf.nn.relu(self.conv(x))

    x = keras.Input((8, 8, 3))
    h = L.Conv2D(6, 3, name="stem")(L.Conv2D(16, 3, name="first")(x))
    model = keras.Model(x, L.Dense(2)(L.Flatten()(TfBlock(name="tf_block")(h))))
    with pytest.raises(kp.UnsupportedLayerError, match=r"(?s)'tf_block' of class TfBlock.*"
                       r"ignore=\['tf_block'\]"):
        kp.precrop(model, params=0.5)
    new = kp.precrop(model, params=0.8, ignore=["tf_block"])
    assert new.get_layer("stem").filters == 6  # it feeds a block kept whole
    assert new.get_layer("first").filters < 16
    assert new.count_params() == new.precrop_plan.params


def test_latency_budget_on_a_subclassed_model():
    """A latency model fits on a traced model's variants; the plan meets its budget."""
    from tests.test_latency import _synthetic_seconds, _timer

    model = _resnet()
    lm = kp.latency_model(model, batch_size=4, variants=12, timer=_timer(), verbose=0)
    new = kp.precrop(model, latency=0.5, latency_model=lm)
    assert_matches_plan(model, new.precrop_plan, new)
    full = kp.precrop(model, params=1.0)  # the original as a functional model (the trace leaves
    ratio = _synthetic_seconds(new) / _synthetic_seconds(full)  # no call nodes on its layers)
    assert ratio < 0.6


def test_pruning_baselines_mask_the_models_own_weights():
    """SynFlow scores every kernel inside the blocks, and its masks hold in the model itself."""
    model = _resnet()
    masks = kp.pai.synflow(model, 0.3, verbose=0)
    kernels = {layer.kernel.path for layer in trace.traced(model).functional.layers
               if isinstance(layer, (L.Conv2D, L.Dense))}
    assert set(masks) == kernels and len(kernels) == 9
    kp.pai.apply_masks(model, masks)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(np.random.default_rng(0).random((4, 16, 16, 3)).astype("float32"), np.arange(4),
              epochs=1, verbose=0)
    weights = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    for path, mask in masks.items():
        assert not weights[path][mask == 0].any(), path


@pytest.mark.parametrize("name", sorted(MODELS))
def test_kept_weights_carry_through_the_trace(name):
    """weights='keep' reads the blocks' own variables: all channels kept gives the same function."""
    model = MODELS[name]()
    _randomize(model)
    same = kp.precrop(model, params=1.0, weights="keep")
    x = _input(model)
    np.testing.assert_allclose(_numpy(same(x, training=False)), _numpy(model(x, training=False)),
                               atol=1e-5)
    half = kp.precrop(model, params=0.5, weights="keep")
    assert_matches_plan(model, half.precrop_plan, half)


class Transposing(L.Layer):
    """A conv, then a transpose that moves the channels: refused until ignored."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(6, 3, padding="same", name="conv")

    def call(self, x):
        return ops.transpose(self.conv(x), (0, 3, 1, 2))


def test_ops_inside_a_block_are_named_by_place_and_ignore_names_them():
    """An op's own name counts every op of its kind in the process (``transpose_7``); by place it
    is the same in every trace, so the name in the error is the one ``ignore`` accepts."""
    x = keras.Input((8, 8, 3))
    h = Transposing(name="block")(L.Conv2D(4, 3, name="stem")(x))
    model = keras.Model(x, L.Dense(2, name="head")(L.Flatten()(h)))
    with pytest.raises(kp.UnsupportedLayerError, match=r"'block_transpose'.*ignore=\['block_transpose'\]"):
        kp.profile(model)
    new = kp.precrop(model, params=0.8, ignore=["block_transpose"])
    assert_matches_plan(model, new.precrop_plan, new)
    assert new.get_layer("block_conv").filters == 6  # it feeds the op kept whole
    assert new.get_layer("stem").filters < 4


def test_nested_model_built_for_any_size_is_traced_at_the_size_it_is_called_on():
    """A nested encoder with an undefined input size (keras_hub's inside DeepLabV3) is dissolved:
    its layers get the outer model's sizes, which their MACs need."""
    e = keras.Input((None, None, 3))
    encoder = keras.Model(e, L.Conv2D(12, 3, strides=2, name="enc")(L.Conv2D(8, 3, name="enc0")(e)),
                          name="encoder")
    x = keras.Input((16, 16, 3))
    model = keras.Model(x, L.Dense(3, name="head")(L.GlobalAveragePooling2D()(encoder(x))))
    assert kp.profile(model).total_macs == tf_macs(model)
    new = kp.precrop(model, flops=0.5)
    assert_matches_plan(model, new.precrop_plan, new)
    assert "encoder_enc" in {layer.name for layer in new.layers}


# -- issue 42, defect 14: plans by place; Keras' own wrapper layers stay whole ---


class AutoBlock(L.Layer):
    """A block whose sublayers have Keras' automatic names (``conv2d_7``, ...)."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(filters, 3, padding="same")
        self.bn = L.BatchNormalization()

    def call(self, x, training=None):
        return ops.relu(self.bn(self.conv(x), training=training))


class AutoNet(keras.Model):
    """A subclassed model named nowhere: every name is Keras' global counter."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, padding="same")
        self.blocks = [AutoBlock(8), AutoBlock(16)]
        self.pool = L.GlobalAveragePooling2D()
        self.head = L.Dense(10)

    def call(self, x, training=None):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, training=training)
        return self.head(self.pool(x))


def test_a_plan_applies_to_another_instance_of_a_subclassed_model():
    first, second = AutoNet(), AutoNet()
    for model in (first, second):
        model(np.zeros((1, 16, 16, 3), "float32"))
    assert [layer.name for layer in first.layers] != [layer.name for layer in second.layers]
    plan = kp.plan(first, params=0.5)
    new = kp.apply_plan(second, plan)
    assert_matches_plan(second, plan, new)
    assert new.count_params() == kp.apply_plan(first, plan).count_params() == plan.params


@pytest.mark.parametrize("wrap", ["bidirectional", "time_distributed", "rnn"])
def test_keras_wrapper_layers_stay_whole_and_are_named_when_unsupported(wrap):
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 8))
    wrapped = {"bidirectional": lambda: L.Bidirectional(L.LSTM(4), name="wrapped"),
               "time_distributed": lambda: L.TimeDistributed(L.Dense(5), name="wrapped"),
               "rnn": lambda: L.RNN(L.SimpleRNNCell(4), name="wrapped")}[wrap]()
    h = L.Dense(6, name="hidden")(L.Flatten()(wrapped(x)))
    model = keras.Model(x, L.Dense(2, name="out")(h))
    assert not trace.is_composite(model.get_layer("wrapped"))
    with pytest.raises(kp.UnsupportedLayerError) as err:
        kp.profile(model)
    message = str(err.value)
    assert "'wrapped'" in message and "call() failed" not in message
    assert err.value.arguments == {"ignore": ["wrapped"]}
    prof = kp.profile(model, ignore=["wrapped"])
    assert prof.total_params == model.count_params()
    if wrap == "time_distributed":  # no loop: its MACs are TensorFlow's own
        assert prof.total_macs == tf_macs(model)
