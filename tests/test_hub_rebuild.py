"""Layers whose class cannot re-create itself from its own config rebuild by a checked repair.

keras_hub 0.32's Swin ``PatchEmbedding`` cannot write its config,
``DINOV3Attention`` writes one its constructor refuses, and
``SegFormerMultiheadAttention``'s constructor takes no ``name``/``trainable``/
``dtype`` (keras_precrop/graph/_hub_repairs.py): with ``ignore="auto"`` these
backbones profiled exactly but their rebuild was refused (issue 61). Now they
rebuild. References: ``count_params()``, TensorFlow's own MAC count, a
forward pass of the original against a kept-weights identity plan, and the
user's model's fingerprint; a repair that would build another layer is
refused by name, and so is a layer that nothing repairs.
"""

import re

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.graph import _hub_repairs
from tests.conftest import model_fingerprint, tf_macs
from tests.test_auto_ignore import _refused_model
from tests.test_keep_weights import assert_same_function, randomize

keras_hub = pytest.importorskip("keras_hub")

from tests import test_vit_family as family  # noqa: E402

L = keras.layers
_X = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")


def _classifier(backbone, pool):
    """``backbone`` under a pooled MLP head (its own output's channels stay fixed, the head's
    are prunable)."""
    x = keras.Input((32, 32, 3), name="images")
    h = pool(name="pool")(backbone(x))
    h = L.Dense(64, activation="relu", name="mlp")(h)
    return keras.Model(x, L.Dense(10, name="head")(h))


def _identity_keeps_the_function(model):
    """An identity plan (``params=1.0``) with kept weights computes ``model``'s outputs."""
    same = kp.apply_plan(model, kp.plan(model, params=1.0, ignore="auto"), weights="keep")
    assert_same_function(model, same, _X, tol=1e-5)


def _prunes_as_planned(model, params, layer_class):
    """``precrop(params=..., ignore="auto")`` rebuilds a model that keeps the layers of
    ``layer_class`` whole (re-created by a repair) and costs what its plan says."""
    before = model_fingerprint(model)
    new = kp.precrop(model, params=params, ignore="auto")
    plan = new.precrop_plan
    assert new.count_params() == plan.params <= params * model.count_params()
    assert tf_macs(new) == plan.macs < tf_macs(model)
    repaired = [layer for layer in new._flatten_layers() if type(layer).__name__ == layer_class]
    assert repaired, f"no {layer_class} in the rebuilt model"
    _identity_keeps_the_function(model)
    assert model_fingerprint(model) == before  # the user's model is untouched
    return new


def test_dinov3_attention_is_repaired_and_dinov3_prunes():
    """``DINOV3Attention.get_config`` writes ``query_bias``...; its constructor takes
    ``use_query_bias``... (a ``TypeError`` from ``Layer.__init__``): the repair renames them."""
    model = randomize(family._dinov3())
    new = _prunes_as_planned(model, 0.7, "DINOV3Attention")
    for path in ("encoder_layers_0_attention", "encoder_layers_1_attention"):
        assert path in new.precrop_plan.ignore


def test_mit_attention_is_repaired_and_a_mit_classifier_prunes():
    """``SegFormerMultiheadAttention.__init__`` takes no ``name``/``trainable``/``dtype``: built
    without them, they are set afterwards."""
    model = randomize(_classifier(family._mit(), L.GlobalAveragePooling2D))
    new = _prunes_as_planned(model, 0.95, "SegFormerMultiheadAttention")  # its minimum: 0.9
    assert new.get_layer("mlp").units < 64
    def attention(m):  # named after their traced paths (Keras numbers names per process)
        return [layer.name for layer in m._flatten_layers()
                if type(layer).__name__ == "SegFormerMultiheadAttention"]

    assert len(attention(new)) == len(attention(model)) == 2
    assert all(re.search(r"hierarchical_encoder_[01]_0_seg_former_multihead_attention(_\d+)?$", name)
               for name in attention(new)), attention(new)


@pytest.mark.slow  # 15 s
def test_segformer_on_mit_prunes():
    model = randomize(family._segformer())
    _prunes_as_planned(model, 0.97, "SegFormerMultiheadAttention")  # its minimum: 0.952


@pytest.mark.slow  # 40 s: Swin's trace, three times
def test_swin_patch_embedding_is_repaired_and_a_swin_classifier_prunes():
    """Swin ``PatchEmbedding.get_config`` raises ``TypeError`` (its ``norm_layer`` class): the
    repair writes the config from the layer's attributes."""
    model = randomize(_classifier(family._swin(), L.GlobalAveragePooling1D))
    new = _prunes_as_planned(model, 0.97, "PatchEmbedding")  # its minimum: 0.928
    assert new.get_layer("mlp").units < 64


# -- the general fallback and its check, on custom layers ----------------------------------------


class Offset(keras.layers.Layer):
    """A per-channel scale plus a constant ``offset``, whose constructor takes no ``name``,
    ``trainable`` or ``dtype`` (no ``**kwargs``), as keras_hub's SegFormerMultiheadAttention.
    Keras writes its config (``offset`` as given, and the base arguments). Its layers are named
    after the class, so the class name has no leading underscore: a layer name starting with one
    leaves a Keras name scope open in a TensorFlow graph (``tf.name_scope`` rejects the name after
    Keras pushed it), and every later variable path gains it as a prefix."""

    def __init__(self, offset=0.0):
        super().__init__()
        self.offset = offset

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.scale + self.offset


def _offset_model(offset=0.5):
    layer = Offset(offset)
    return _refused_model(layer), layer


def test_a_constructor_without_base_arguments_is_rebuilt_with_them_set_afterwards():
    model, layer = _offset_model()
    layer.scale.assign(np.linspace(0.5, 2.0, 16).astype("float32"))
    layer.trainable = False
    before = model_fingerprint(model)
    with pytest.raises(TypeError):  # Keras itself cannot re-create it
        type(layer).from_config({**layer.get_config(), "name": layer.name})
    new = kp.precrop(model, params=0.5, ignore="auto", weights="keep")
    plan = new.precrop_plan
    assert plan.ignore == [layer.name]
    assert new.count_params() == plan.params <= 0.5 * model.count_params()
    assert tf_macs(new) == plan.macs < tf_macs(model)
    copy = new.get_layer(layer.name)
    assert type(copy) is Offset and copy is not layer and copy.offset == 0.5
    assert not copy.trainable and copy.dtype_policy.name == layer.dtype_policy.name
    np.testing.assert_array_equal(copy.get_weights()[0], layer.get_weights()[0])
    same = kp.apply_plan(model, kp.plan(model, params=1.0, ignore="auto"), weights="keep")
    assert_same_function(model, same, np.random.default_rng(1).normal(size=(2, 8, 8, 3)), tol=1e-5)
    assert model_fingerprint(model) == before


def test_a_repair_that_would_compute_otherwise_is_refused_by_name():
    """The layer's ``offset`` was changed after it was built: its config still says 0.5, so the
    re-created layer would add another constant; the check finds it on the twin's outputs."""
    model, layer = _offset_model()
    layer.offset = 2.0
    with pytest.raises(kp.UnsupportedModelError, match=rf"Layer '{layer.name}' of class Offset "
                       r"cannot be re-created from its own config, nor by keras_precrop's repair "
                       r"of its class \(its twin's outputs differ from the original's by up to 1.5"):
        kp.precrop(model, params=0.5, ignore="auto")


class _Renamed(keras.layers.Layer):
    """Writes ``size`` into its config, takes ``units``: no repair knows it."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def call(self, x):
        return x

    def get_config(self):
        return {**super().get_config(), "size": self.units}


class _Unwritable(_Renamed):
    """Cannot write its config at all."""

    def get_config(self):
        raise TypeError("no config")


@pytest.mark.parametrize("cls,what", [(_Renamed, "be re-created from its own config"),
                                      (_Unwritable, "write its own config")])
def test_a_layer_nothing_repairs_is_still_refused_by_name(cls, what):
    model = _refused_model(cls(name="odd"))
    with pytest.raises(kp.UnsupportedModelError, match=rf"Layer 'odd' of class {cls.__name__} "
                       rf"cannot {what} \(TypeError: .*ignore=\[its name\]"):
        kp.precrop(model, params=0.5, ignore="auto")


class _MissingAttribute(_Renamed):
    """Its get_config reads an attribute its constructor never set (keras_hub 0.32's
    ``LlamaTransformerDecoder``: ``rope_scaling_factor``)."""

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def test_a_layer_whose_config_raises_is_refused_by_name_on_an_open_length_too():
    """A params budget on a sequence of open length walks a copy at a probe length; that copy is
    made from configs, so a get_config that raises AttributeError is refused by the layer's name,
    not passed on raw."""
    x = keras.Input((None, 8), name="tokens")
    h = _MissingAttribute(name="odd")(keras.layers.Dense(8, name="d0")(x))
    model = keras.Model(x, keras.layers.Dense(3, name="head")(h))
    with pytest.raises(kp.UnsupportedModelError, match=r"Layer 'odd' of class _MissingAttribute "
                       r"cannot write its own config \(AttributeError: .*'scale'"):
        kp.precrop(model, params=0.5)


def test_a_layer_only_a_repair_recreates_is_refused_on_an_open_size():
    """A params budget on an image of open size walks a copy at a probe size. A repair is trusted
    only once checked against the original on inputs of its sizes, which open sizes do not give;
    a repaired copy would later be checked against a twin of itself. So the copy is made without
    repairs and the layer is refused by name: here a repair would have kept ``offset`` 0.5, its
    config's, where the layer adds 2.0."""
    layer = Offset(0.5)
    x = keras.Input((None, None, 3), name="img")
    h = keras.layers.Conv2D(16, 3, padding="same", name="c0")(x)
    h = keras.layers.Conv2D(16, 3, padding="same", name="c1")(layer(h))
    model = keras.Model(x, keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling2D()(h)))
    layer.offset = 2.0
    with pytest.raises(kp.UnsupportedModelError, match=rf"Layer '{layer.name}' of class Offset cannot "
                       r"be re-created from its own config \(TypeError"):
        kp.precrop(model, params=0.5, ignore="auto", weights="keep")


def test_a_table_repair_that_builds_another_layer_is_refused_by_name(monkeypatch):
    """The check covers the table's repairs too: one that would drop DINOv3's query bias."""
    key = "keras_hub.src.models.dinov3.dinov3_layers.DINOV3Attention"
    repair = _hub_repairs._REPAIRS[key]
    wrong = lambda cls, config: repair.create(cls, {**config, "query_bias": False})  # noqa: E731
    monkeypatch.setitem(_hub_repairs._REPAIRS, key, repair._replace(create=wrong))
    model = family._dinov3()
    with pytest.raises(kp.UnsupportedModelError, match="Layer 'encoder_layers_0_attention' of "
                       "class DINOV3Attention cannot be re-created .*\\(its twin differs in its "
                       "config: query_bias: False instead of True\\)"):
        kp.apply_plan(model, kp.plan(model, params=1.0, ignore="auto"))


def test_a_repair_is_checked_once_per_walk_however_many_rebuilds(monkeypatch):
    """A latency model rebuilds one walk many times; the repaired layer's twin check (a forward
    pass) runs for the first rebuild only, and every rebuild still re-creates the layer."""
    from keras_precrop.graph.rebuild import rebuild
    from keras_precrop.graph.walker import walk

    model, layer = _offset_model()
    checks = []
    check = _hub_repairs.difference
    monkeypatch.setattr(_hub_repairs, "difference", lambda *a: checks.append(a[0]) or check(*a))
    graph = walk(model, ignore=[layer.name])
    widths = [v.width for v in graph.variables]
    first, second = rebuild(graph, widths), rebuild(graph, widths)
    assert checks == [layer]
    assert type(first.get_layer(layer.name)) is type(second.get_layer(layer.name)) is Offset
    assert graph.repairs_checked == {id(layer): None}
    assert walk(model, ignore=[layer.name]).repairs_checked == {}  # a new walk checks anew
