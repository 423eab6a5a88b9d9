"""Messages that say what the user did wrong, in the user's words (issue 42).

Each refusal names the user's layer, argument, file or shape; where the
package can do what was meant (a plan file's path, several unsupported
layers at once) it does, checked against an independent reference.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_precrop as kp
from tests.conftest import L


class _Scale(L.Layer):
    """A custom per-channel layer the walker has no handler for."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.w


def _many_unsupported():
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(6, 3, padding="same", name="c0")(x)
    h = L.Lambda(lambda t: t * 2.0, name="lam")(h)
    h = _Scale(name="scale")(h)
    h = L.Conv2D(8, 1, name="c1")(h)
    h = ops.pad(h, [[0, 0], [0, 0], [0, 0], [0, 2]])  # pads the channel axis
    h = L.Permute((2, 1, 3), name="perm")(h)
    return keras.Model(x, L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(h)))


def test_every_unsupported_layer_and_op_is_named_with_the_complete_ignore():
    model = _many_unsupported()
    with pytest.raises(kp.UnsupportedLayerError) as info:
        kp.profile(model)
    message, ignore = str(info.value), info.value.arguments["ignore"]
    pad = next(op.name for op in model.operations if op.name.startswith("pad"))  # pad, pad_1, ...
    assert sorted(ignore) == sorted(["lam", pad, "perm", "scale"])
    assert f"ignore={ignore!r}" in message
    for needle in ("'lam' of class Lambda", "'scale' of class _Scale", "pads the channel axis",
                   "'perm' of class Permute"):
        assert needle in message
    # The pasted ignore= is the whole remedy: one more round is never needed.
    prof = kp.profile(model, ignore=ignore)
    assert prof.total_params == model.count_params()


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a tf.* function")
def test_every_untraceable_composite_is_named_at_once():
    import tensorflow as tf

    class TfBlock(L.Layer):  # a tf.* function on its inputs: traced, it fails; kept whole, it runs
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = L.Conv2D(4, 3, padding="same", name="conv")

        def call(self, x):
            return tf.nn.relu(self.conv(x))

    x = keras.Input((8, 8, 3))
    h = TfBlock(name="second")(TfBlock(name="first")(L.Conv2D(6, 3, name="stem")(x)))
    model = keras.Model(x, L.Dense(2, name="head")(L.Flatten()(h)))
    with pytest.raises(kp.UnsupportedLayerError) as info:
        kp.profile(model)
    assert sorted(info.value.arguments["ignore"]) == ["first", "second"]
    assert "'first' of class TfBlock" in str(info.value)
    assert "'second' of class TfBlock" in str(info.value)
    assert kp.profile(model, ignore=["first", "second"]).total_params == model.count_params()


class _BranchInCall(keras.Model):
    """A subclassed model whose own call() branches in Python on a tensor's value."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, name="conv")
        self.head = L.Dense(2, name="head")

    def call(self, x):
        h = self.conv(x)
        if ops.mean(h) > 0:
            h = -h
        return self.head(ops.mean(h, axis=(1, 2)))


def test_a_built_model_whose_call_branches_in_python_is_not_called_unbuilt():
    model = _BranchInCall(name="branching")
    model(np.ones((1, 8, 8, 3), "float32"))  # Keras builds it eagerly and records no shape
    assert model.built
    with pytest.raises(kp.UnsupportedModelError) as info:
        kp.profile(model)
    message = str(info.value)
    assert "'branching'" in message and "is built" in message and "not built" not in message
    assert "Python `if` on a tensor's value" in message and "keras.ops.where" in message


class _OpenSize(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, name="conv")
        self.head = L.Dense(2, name="head")

    def call(self, x):
        return self.head(ops.mean(self.conv(x), axis=(1, 2)))


def test_an_open_input_shape_is_printed_as_the_user_built_it():
    model = _OpenSize(name="open")
    model.build((None, None, None, 3))
    with pytest.raises(kp.UnsupportedModelError) as info:
        kp.precrop(model, params=0.5)
    assert "(None, None, None, 3)" in str(info.value)
    assert "224, 224, 224" not in str(info.value)
    assert str(info.value).endswith("e.g. keras.Input((224, 224, 3), name='open_input') or "
                                    "model.build((None, 224, 224, 3)).")


def _cnn(size=32):
    x = keras.Input((size, size, 3), name="img")
    h = L.Conv2D(8, 3, padding="same", name="c0")(x)
    h = L.Conv2D(8, 3, padding="same", name="c1")(h)
    return keras.Model(x, L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(h)),
                       name=f"cnn{size}")


def test_plan_files_by_path_and_what_a_plan_file_holds(tmp_path):
    model = _cnn()
    the_plan = kp.plan(model, params=0.5)
    path = tmp_path / "plan.json"
    the_plan.to_json(path)
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    by_object = kp.apply_plan(model, the_plan, weights="keep")
    for given in (str(path), path):  # a str or an os.PathLike
        new = kp.apply_plan(model, given, weights="keep")
        assert new.count_params() == the_plan.params
        np.testing.assert_allclose(new(x), by_object(x), rtol=1e-6)
    missing = tmp_path / "nope.json"
    with pytest.raises(kp.ArgumentError, match=f"plan={str(missing)!r} names no file"):
        kp.apply_plan(model, missing)
    with pytest.raises(FileNotFoundError, match=str(missing)):
        kp.Plan.from_json(str(missing))
    with pytest.raises(ValueError, match="holds a list, not an object; a Plan file holds one "
                       "JSON object with the fields model_name, mode"):
        kp.Plan.from_json("[1, 2]")
    path.write_text("[1, 2]")
    with pytest.raises(kp.ArgumentError, match=f"plan={str(path)!r} holds no plan"):
        kp.apply_plan(model, path)


def test_a_plan_applied_at_another_input_size_names_both_sizes():
    the_plan = kp.plan(_cnn(32), params=0.5)
    assert kp.Plan.from_json(the_plan.to_json()).input_shapes == [[32, 32, 3]]
    with pytest.raises(kp.PlanMismatchError, match=r"made for input shape \(32, 32, 3\), but "
                       r"model 'cnn64' takes \(64, 64, 3\)"):
        kp.apply_plan(_cnn(64), the_plan)
    old = {k: v for k, v in the_plan.to_dict().items() if k != "input_shapes"}
    assert kp.Plan.from_dict(old).input_shapes is None  # older files load
    assert kp.apply_plan(_cnn(32), kp.Plan.from_dict(old)).count_params() == the_plan.params


def _small_vit():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=2,
                                            num_heads=4, hidden_dim=32, mlp_dim=64)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10, preprocessor=None)


def test_a_short_name_inside_a_backbone_is_answered_with_the_names_it_may_mean():
    """``ignore=["ln_1"]`` (the name the block's own summary shows) is refused with the names
    of the task's layers it may mean; each of them is then accepted and kept whole."""
    task = _small_vit()
    with pytest.raises(kp.ArgumentError, match="ln_1") as caught:
        kp.plan(task, params=0.5, ignore=["ln_1"])
    meant = sorted(layer.name for layer in kp.profile(task).layers if layer.name.endswith("_ln_1"))
    assert len(meant) == 2  # one per block (the backbone's name varies with the models made before)
    assert all(repr(name) in str(caught.value) for name in meant)
    assert caught.value.arguments["ignore"] == ["ln_1"]
    plan = kp.plan(task, params=0.8, ignore=meant)
    assert sorted(plan.ignore) == meant


def test_the_ignore_a_refusal_offers_is_accepted_as_given():
    """A refusal's remedy names the layer as ``ignore=`` takes it (once the composite's inner
    name ``ln_1``, which ``ignore=`` then refused), and taking it gives the widened model whose
    new channels compute nothing: the original's outputs."""
    task = _small_vit()
    with pytest.raises(kp.ArgumentError, match="normalizes over the channel axis") as caught:
        kp.hub.reconfigure(task, params=1.2, weights="keep")
    offered = caught.value.arguments["ignore"]
    assert f"ignore={offered!r}" in str(caught.value)
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    for _ in range(8):  # each pass names the next normalization that cannot widen
        try:
            wide = kp.hub.reconfigure(task, params=1.2, weights="keep", ignore=offered)
            break
        except kp.ArgumentError as err:
            assert "normalizes over the channel axis" in str(err), err
            offered = offered + err.arguments["ignore"]
    assert wide.count_params() > task.count_params()
    np.testing.assert_allclose(ops.convert_to_numpy(wide(x)), ops.convert_to_numpy(task(x)),
                               atol=1e-5)


def test_taylor_on_a_model_of_several_outputs_is_refused_by_its_outputs():
    """Taylor's loss is one cross-entropy of one output (a raw AttributeError on a list once);
    the refusal names the output layers, and the activation ranking it offers works."""
    keras.utils.set_random_seed(0)
    x = keras.Input((10, 16))
    h = L.Dense(24, name="proj")(x)
    attended, scores = L.MultiHeadAttention(4, 6, name="att")(h, h, return_attention_scores=True)
    logits = L.Dense(5, name="head")(L.GlobalAveragePooling1D()(attended))
    model = keras.Model(x, [logits, scores])
    batch = np.random.default_rng(0).random((3, 10, 16)).astype("float32")
    data = (batch, [np.array([0, 1, 2]), np.zeros((3, 4, 10, 10), "float32")])
    refused = r"importance='taylor'.* 2 outputs \(of layers 'head', 'att'\)"
    with pytest.raises(kp.ArgumentError, match=refused):
        kp.precrop(model, params=0.5, weights="keep", importance="taylor", data=data)
    small = kp.precrop(model, params=0.5, weights="keep", importance="activation", data=data)
    assert small.count_params() == small.precrop_plan.params


@pytest.mark.parametrize("call", ["precrop", "reconfigure"])
def test_a_misspelt_keyword_is_named_as_the_called_functions_with_its_spelling(call):
    """``kp.precrop(model, attenton=...)`` once raised ``plan() got an unexpected keyword``; the
    keywords each takes of its own (``weights``, ``seed``) still pass."""
    model = keras.Sequential([keras.Input((4,)), L.Dense(8), L.Dense(2)])
    assert getattr(kp, call)(model, params=0.9, weights="keep", seed=None).count_params() > 0
    with pytest.raises(TypeError, match=rf"^{call}\(\) got an unexpected keyword argument "
                                        r"'attenton'; did you mean 'attention'\?$"):
        getattr(kp, call)(model, params=0.5, attenton="heads")


@pytest.mark.parametrize("call", ["precrop", "reconfigure"])
def test_a_misspelt_keyword_to_the_hub_is_named_as_the_hubs(call):
    task = _small_vit()
    with pytest.raises(TypeError, match=rf"^hub\.{call}\(\) got an unexpected keyword argument "
                                        r"'atention'; did you mean 'attention'\?$"):
        getattr(kp.hub, call)(task, params=0.5, atention="heads")
