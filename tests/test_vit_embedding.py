"""keras_hub's patch embeddings create a vision transformer's hidden stream (issue 61).

A small functional transformer block on each embedding layer keras_hub 0.32
ships for its vision transformers (built from constructors, no download):
the profile against Keras' parameter count and TensorFlow's MACs, PreCrop's
rebuild against its plan with the embedding's new ``hidden_dim`` in its
config, a ``.keras`` round trip, and kept weights: an identity plan computes
the original's outputs, a pruned one slices every hidden axis of the
embedding (tokens, position embeddings, the projection) to the channels the
norm and the residual branch keep.

The handlers are registered here for the duration of each test until
``handlers.py`` registers them (``embedding.VIT_EMBEDDINGS``).
"""

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras_precrop as kp  # noqa: E402
from keras_precrop.graph import embedding, handlers  # noqa: E402
from tests.conftest import assert_matches_plan, tf_macs  # noqa: E402
from tests.test_keep_weights import (  # noqa: E402
    assert_same_function,
    gathered_indices,
    randomize,
)

L = keras.layers
hub = keras_hub.src.models

# name -> (the layer's class, its constructor arguments besides hidden_dim)
EMBEDDINGS = {
    "vit": (hub.vit.vit_layers.ViTPatchingAndEmbedding, dict(image_size=(32, 32), patch_size=(4, 4))),
    "vit_no_token_no_bias": (hub.vit.vit_layers.ViTPatchingAndEmbedding,
                             dict(image_size=(32, 32), patch_size=(4, 4), use_class_token=False,
                                  use_patch_bias=False)),
    "deit": (hub.deit.deit_layers.DeiTEmbeddings,
             dict(image_size=(32, 32), patch_size=(4, 4), use_mask_token=True)),
    "dinov2": (hub.dinov2.dinov2_layers.DINOV2Embedding,
               dict(patch_size=4, image_shape=(32, 32), num_register_tokens=2,
                    position_embedding_shape=(48, 48))),
    "dinov3": (hub.dinov3.dinov3_layers.DINOV3Embedding, dict(patch_size=4, num_register_tokens=2)),
    "clip": (hub.clip.clip_layers.CLIPVisionEmbedding, dict(patch_size=4, image_size=32)),
    "siglip": (hub.siglip.siglip_layers.SigLIPVisionEmbedding, dict(patch_size=4, image_size=32)),
}


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    for name, rule in embedding.VIT_EMBEDDINGS:
        monkeypatch.setitem(handlers._REGISTRY, name, rule)


def _block(name, hidden=32, mlp=64):
    """images -> embedding -> LayerNorm -> Dense(mlp) -> Dense(hidden) -> residual Add -> pool -> head."""
    cls, options = EMBEDDINGS[name]
    x = keras.Input((32, 32, 3), name="images")
    h = cls(hidden_dim=hidden, name="embed", **options)(x)
    n = L.LayerNormalization(name="norm")(h)
    m = L.Dense(mlp, activation="gelu", name="mlp1")(n)
    m = L.Dense(hidden, name="mlp2")(m)
    h = L.Add(name="residual")([h, m])
    return keras.Model(x, L.Dense(10, name="head")(L.GlobalAveragePooling1D(name="pool")(h)))


def _phantom_macs(name, model):
    """The MACs the walker counts on a token the layer declares but does not compute.

    keras_hub 0.32's ``SigLIPVisionEmbedding`` declares a class token it does not
    add (65 tokens, computes 64): the MLP's Dense layers count one row more (a note says so).
    """
    if name != "siglip":
        return 0
    return sum(int(np.prod(model.get_layer(n).kernel.shape)) for n in ("mlp1", "mlp2"))


def _images(n=4):
    return np.random.default_rng(1).normal(size=(n, 32, 32, 3)).astype("float32")


@pytest.mark.parametrize("name", sorted(EMBEDDINGS))
def test_profile_is_exact(name):
    model = _block(name)
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model) + _phantom_macs(name, model)
    if name == "siglip":
        assert any("declares output shape (None, 65, 32) but computes (None, 64, 32)" in note
                   for note in prof.notes)
    else:
        assert not prof.notes
    embed = model.get_layer("embed")
    patches = 8 * 8
    row = next(r for r in prof.layers if r.name == "embed")
    assert row.macs == patches * 4 * 4 * 3 * 32  # the projection, one kernel per patch
    assert row.params == embed.count_params()


@pytest.mark.parametrize("name", sorted(EMBEDDINGS))
def test_precrop_rebuilds_the_embedding_with_its_new_hidden_dim(name, tmp_path):
    model = _block(name)
    new = kp.precrop(model, params=0.5)
    plan = new.precrop_plan
    if name == "siglip":
        assert new.count_params() == plan.params
        assert tf_macs(new) + _phantom_macs(name, new) == plan.macs
    else:
        assert_matches_plan(model, plan, new)
    hidden = new.get_layer("embed").get_config()["hidden_dim"]
    row = next(r for r in plan.layers if r["name"] == "embed")
    assert hidden == int(row["channels_new"]) < 32  # the stream, which mlp2 writes a prefix of
    assert new.get_layer("mlp2").units <= hidden
    assert new.get_layer("embed").output.shape[-1] == hidden
    assert new(_images()).shape == (4, 10)
    for key in ("use_class_token", "use_patch_bias"):  # what ViT's get_config forgets stays
        assert getattr(new.get_layer("embed"), key, None) == getattr(model.get_layer("embed"), key, None)
    _assert_reloads(new, tmp_path / "pruned.keras")


def _assert_reloads(model, path):
    """``model`` saved to ``path`` loads back with Keras alone (no custom objects), computing the
    same outputs."""
    model.save(path)
    assert_same_function(model, keras.models.load_model(path), _images(), tol=0)


@pytest.mark.parametrize("name", ["vit", "vit_no_token_no_bias"])
def test_the_pruned_model_reloads_where_keras_hub_cannot_reload_the_original(name, tmp_path):
    """keras_hub 0.32's ViT embedding writes ``num_patches`` and ``num_positions``, which its
    constructor refuses, and forgets ``use_patch_bias``: the user's original cannot be loaded
    back from ``.keras``. The rebuilt layer saves the config it was created from, so the pruned
    model loads as it is, its embedding still without a patch bias where it had none."""
    original = _block(name)
    original.save(tmp_path / "original.keras")
    with pytest.raises(TypeError, match="num_patches"):
        keras.models.load_model(tmp_path / "original.keras")
    pruned = kp.precrop(original, params=0.5)
    _assert_reloads(pruned, tmp_path / "pruned.keras")
    loaded = keras.models.load_model(tmp_path / "pruned.keras").get_layer("embed")
    assert loaded.use_patch_bias == original.get_layer("embed").use_patch_bias
    assert loaded.hidden_dim == pruned.get_layer("embed").hidden_dim < 32


@pytest.mark.parametrize("name", sorted(EMBEDDINGS))
def test_an_identity_plan_with_kept_weights_computes_the_original(name):
    model = randomize(_block(name))
    plan = kp.plan(model, params=1.0)
    assert all(v["new"] == v["width"] for v in plan.variables)
    assert_same_function(model, kp.apply_plan(model, plan, weights="keep"), _images())


@pytest.mark.parametrize("name", ["vit", "deit", "dinov2"])
def test_kept_weights_slice_every_hidden_axis_to_the_stream_s_channels(name):
    """Every weight of the embedding along the hidden axis keeps the channels the norm keeps."""
    model = randomize(_block(name), kernels=True)  # every value distinct: it tells where it was
    new = kp.precrop(model, params=0.5, weights="keep")
    kept = gathered_indices(model.get_layer("norm").gamma, new.get_layer("norm").gamma)[-1]
    assert len(kept) < 32 and (kept >= 0).all()
    old, rebuilt = model.get_layer("embed"), new.get_layer("embed")
    for w_old, w_new in zip(old.weights, rebuilt.weights, strict=True):
        if "float" not in str(w_old.dtype):
            continue
        indices = gathered_indices(w_old, w_new)
        np.testing.assert_array_equal(indices[-1], kept, err_msg=w_old.path)
        for axis, index in enumerate(indices[:-1]):  # every other axis whole
            np.testing.assert_array_equal(index, np.arange(w_old.shape[axis]), err_msg=w_old.path)


def test_a_channels_first_embedding_is_refused_by_name():
    x = keras.Input((3, 32, 32))
    h = EMBEDDINGS["vit"][0](image_size=(32, 32), patch_size=(4, 4), hidden_dim=32,
                             data_format="channels_first", name="embed")(x)
    model = keras.Model(x, L.GlobalAveragePooling1D()(h))
    with pytest.raises(kp.UnsupportedLayerError, match="embed: .*is channels_first") as err:
        kp.profile(model)
    assert err.value.arguments["ignore"] == ["embed"]
    assert kp.profile(model, ignore=["embed"]).total_params == model.count_params()
