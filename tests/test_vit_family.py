"""keras_hub 0.32's other vision transformers, built offline from tiny configs (issue 61).

Each backbone either profiles exactly (parameters equal ``count_params()``,
MACs equal TensorFlow's own count) or is refused by name with an ``ignore=``
that ``profile`` accepts: the test passes each refusal's own ``ignore=``
back until the profile passes, and a ``TypeError`` from inside the package
fails it (the survey, experiments/results/vit_hub_survey.md, met four).
DINOv2 walks whole and is pruned end to end.
"""

import re

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras_precrop as kp  # noqa: E402
from keras_precrop.errors import UnsupportedLayerError  # noqa: E402
from tests.conftest import assert_matches_plan, model_fingerprint, tf_macs  # noqa: E402
from tests.test_keep_weights import assert_same_function, randomize  # noqa: E402

hub = keras_hub.src.models
ops = keras.ops


def _mit():
    return hub.mit.mit_backbone.MiTBackbone(
        layerwise_depths=[1, 1], num_layers=2, layerwise_num_heads=[1, 2],
        layerwise_sr_ratios=[2, 1], max_drop_path_rate=0.0, layerwise_patch_sizes=[3, 3],
        layerwise_strides=[2, 2], image_shape=(32, 32, 3), hidden_dims=[16, 32])


def _segformer():
    return hub.segformer.segformer_backbone.SegFormerBackbone(image_encoder=_mit(),
                                                              projection_filters=16)


def _swin():
    return hub.swin_transformer.swin_transformer_backbone.SwinTransformerBackbone(
        image_shape=(32, 32, 3), embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4,
        patch_size=2)


def _dinov2(swiglu=False):
    return hub.dinov2.dinov2_backbone.DINOV2Backbone(
        patch_size=4, num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
        image_shape=(32, 32, 3), position_embedding_shape=(48, 48, 3), num_register_tokens=2,
        use_swiglu_ffn=swiglu)


def _dinov3():
    return hub.dinov3.dinov3_backbone.DINOV3Backbone(
        patch_size=4, num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
        image_shape=(32, 32, 3))


def _vitdet():
    return hub.vit_det.vit_det_backbone.ViTDetBackbone(
        hidden_size=32, num_layers=2, intermediate_dim=64, num_heads=2,
        global_attention_layer_indices=[1], image_shape=(64, 64, 3), patch_size=8,
        window_size=4, num_output_channels=16)


def _profile_past_refusals(model):
    """``profile(model)``, passing each refusal's own ``ignore=`` back until it profiles.

    Returns:
        ``(profile, refusals)``: the profile and the messages of the refusals on the way.
    """
    ignore, refusals = [], []
    for _ in range(5):
        try:
            return kp.profile(model, ignore=ignore), refusals
        except UnsupportedLayerError as err:
            offered = err.arguments.get("ignore")
            assert offered and not set(offered) & set(ignore), str(err)
            refusals.append(str(err))
            ignore += offered
    raise AssertionError(f"still refused after ignore={ignore}")


def test_mit_reshape_to_open_sizes_refuses_its_layer_by_name():
    """MiT's attention and MixFFN reshape by ``ops.shape(x)[0]`` and -1 together (two sizes left
    open, which the trace cannot replay; before: ``TypeError`` in the reshape's walk): each such
    layer is named, kept whole, and the rest profiles exactly."""
    model = _mit()
    before = model_fingerprint(model)
    prof, refusals = _profile_past_refusals(model)
    assert len(refusals) == 1
    for block in ("0_0", "1_0"):
        for layer in (f"hierarchical_encoder_{block}_seg_former_multihead_attention",
                      f"hierarchical_encoder_{block}_mix_ffn"):
            assert f"Layer {layer!r}" in refusals[0]
    assert "reshapes sizes it leaves open" in refusals[0]
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    assert model_fingerprint(model) == before


def test_segformer_on_mit_profiles_past_named_refusals():
    model = _segformer()
    prof, refusals = _profile_past_refusals(model)
    assert len(refusals) == 1 and "reshapes sizes it leaves open" in refusals[0]
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)


def _profile_past_one_refusal(model, phrases):
    """The profile of ``model`` past one refusal that names every one of ``phrases`` at once;
    its parameters are checked against ``count_params()``."""
    prof, refusals = _profile_past_refusals(model)
    assert len(refusals) == 1
    for phrase in phrases:
        assert phrase in refusals[0]
    assert prof.total_params == model.count_params()
    return prof


@pytest.mark.slow  # 15 s
def test_swin_profiles_past_named_refusals():
    """Swin's blocks cannot be traced (``None // n``), its patch embedding and merging reshape to
    open sizes: all named at once. A block after a merging kept whole sees open token counts in
    the graph; it is counted at the sizes the merging gave when measured: MACs exact."""
    model = _swin()
    prof = _profile_past_one_refusal(model, (
        "Layer 'patch_embedding' of class PatchEmbedding reshapes sizes",
        "Layer 'stage_0_downsample' of class PatchMerging reshapes sizes"))
    assert not prof.unknown_macs and prof.total_macs == tf_macs(model)


def test_dinov3_profiles_past_named_refusals():
    """DINOv3's attention reshapes its heads back with ``(B, N, -1)`` (before: its ignored
    reshape's open last axis crashed ``Fixed``); its RoPE layer has no handler."""
    model = _dinov3()
    prof = _profile_past_one_refusal(model, (
        "Layer 'encoder_layers_0_attention' of class DINOV3Attention",
        "Layer 'rope_embedding' of class DINOV3RopePositionEmbedding"))
    assert prof.total_macs == tf_macs(model)


def test_vitdet_offers_only_names_ignore_accepts():
    """A refused attention inside an encoder that is then refused too is not offered (before:
    ``profile`` rejected the offered name, "names no layer")."""
    model = _vitdet()
    prof, refusals = _profile_past_refusals(model)
    assert len(refusals) == 1
    encoder = next(layer.name for layer in model.layers  # Keras numbers names per process
                   if type(layer).__name__ == "WindowedTransformerEncoder")
    assert f"{encoder}_multi_head_attention_with_relative_pe" not in refusals[0]
    assert f"Layer '{encoder}' of class WindowedTransformerEncoder" in refusals[0]
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)


@pytest.mark.parametrize("swiglu", [False, True], ids=["mlp", "swiglu"])
def test_dinov2_walks_whole(swiglu):
    """``DINOV2Embedding.compute_output_spec`` takes no ``training``; the training-mode trace used
    to raise its ``TypeError``. Nothing is refused now, and the class keeps its method."""
    embedding = hub.dinov2.dinov2_layers.DINOV2Embedding
    spec = embedding.__dict__["compute_output_spec"]
    model = _dinov2(swiglu)
    before = model_fingerprint(model)
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    assert embedding.__dict__["compute_output_spec"] is spec
    assert model_fingerprint(model) == before


class _OpenTokens(keras.layers.Layer):
    """Declares its token count open: ``(B, None, C)``."""

    def call(self, x):
        return x

    def compute_output_shape(self, shape):
        return (shape[0], None, shape[-1])


class _OpenChannels(_OpenTokens):
    """Declares its channel count open: ``(B, N, None)``."""

    def compute_output_shape(self, shape):
        return (shape[0], shape[1], None)


def _open_model(layer):
    x = keras.Input((64, 16))
    h = layer(keras.layers.Dense(16, name="dense")(x))
    if isinstance(layer, _OpenChannels):
        return keras.Model(x, h)
    h = ops.reshape(h, (-1, 8, 8, 16))
    return keras.Model(x, keras.layers.Conv2D(4, 3, name="conv")(h))


def test_reshape_of_open_sizes_is_refused_by_name():
    """Before: ``TypeError`` (``math.prod`` over ``None``) in the reshape's walk."""
    model = _open_model(_OpenTokens(name="open"))
    prof, refusals = _profile_past_refusals(model)
    assert len(refusals) == 1
    assert "Layer 'open' of class _OpenTokens is not supported" in refusals[0]
    assert "reshapes sizes it leaves open" in refusals[0]
    assert prof.total_params == model.count_params()


def test_kept_whole_layer_of_open_width_is_refused_by_name():
    """Before: ``int(None)`` in ``Fixed``. Keeping it whole is no remedy, and none is offered."""
    model = _open_model(_OpenChannels(name="open"))
    with pytest.raises(UnsupportedLayerError) as first:
        kp.profile(model)
    assert first.value.arguments["ignore"] == ["open"]
    with pytest.raises(UnsupportedLayerError, match="Layer 'open' of class _OpenChannels outputs "
                       r"a tensor of shape \(None, 64, None\), whose channel \(last\) axis has "
                       "no size") as again:
        kp.profile(model, ignore=["open"])
    assert not again.value.arguments


def _dinov2_classifier():
    """DINOv2 under a pooled head, so its hidden stream is no model output (an output's
    channels stay fixed, and the backbone alone cannot then lose half its parameters)."""
    backbone = _dinov2()
    x = keras.Input((32, 32, 3), name="images")
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(backbone(x))
    return randomize(keras.Model(x, keras.layers.Dense(10, name="head")(pooled)))


def test_dinov2_precrop_rebuilds_as_planned_and_keeps_weights():
    model = _dinov2_classifier()
    x = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    small = kp.precrop(model, params=0.5)
    plan = small.precrop_plan
    assert plan.params <= 0.5 * model.count_params()
    assert_matches_plan(model, plan, small)
    assert small(x).shape == (2, 10)
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    assert_same_function(model, same, x, tol=1e-5)


def test_a_layer_kept_whole_that_keras_hub_cannot_recreate_rebuilds_by_a_checked_repair():
    """keras_hub's SegFormerMultiheadAttention's constructor takes no ``name``/``trainable``: a plan
    that keeps it whole with an explicit ``ignore=`` (the refusals' names) rebuilds, re-created by a
    checked repair (graph/_hub_repairs.py; before: refused by name; tests/test_hub_rebuild.py)."""
    model = _mit()
    _, refusals = _profile_past_refusals(model)
    ignore = [name for message in refusals for name in re.findall(r"Layer '([^']+)'", message)]
    plan = kp.plan(model, params=1.0, ignore=ignore)
    assert kp.apply_plan(model, plan).count_params() == plan.params == model.count_params()
