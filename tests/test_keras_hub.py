"""keras_hub CNN backbones and task models, built from their constructors (no download).

Needs ``pip install --no-deps keras-hub tokenizers`` (plain ``pip install
keras-hub`` pulls a second, CUDA, TensorFlow); skipped without keras_hub.

* Every CNN backbone keras_hub 0.32 ships (the rest are transformers):
  the profile against Keras' parameter count and TensorFlow's MACs, PreCrop
  under a parameter and a FLOP budget and PreConfig against their plans, and
  a ``.keras`` round trip of a pruned one.
* Task models, pruned through ``kp.hub``: the task's own class comes back
  with its backbone pruned as planned and its head as the class builds it,
  takes one ``fit`` step with the task's own ``compile()`` defaults and loss
  on a batch in the task's format, and round-trips through ``.keras``.

The heavier cases are marked slow (``pytest -m slow tests/test_keras_hub.py``).
"""

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras_precrop as kp  # noqa: E402
from keras_precrop.graph import trace  # noqa: E402
from tests.conftest import assert_matches_plan, tf_macs  # noqa: E402
from tests.test_keep_weights import (  # noqa: E402
    assert_same_function,
    assert_sliced,
    gathered_indices,
    randomize,
)

M = keras_hub.models


def _resnet(image_shape=(32, 32, 3), **kwargs):
    """A small ResNet (keras_hub requires 64 filters in its first stage)."""
    config = dict(input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 32],
                  stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
                  use_pre_activation=False, image_shape=image_shape)
    config.update(kwargs)
    return M.ResNetBackbone(**config)


def _encoder(levels):
    """A ResNet image encoder for any image size, with pyramid outputs P2 .. P``levels + 1``."""
    return _resnet((None, None, 3), input_conv_filters=[8], block_type="bottleneck_block",
                   stackwise_num_filters=[64] + [8] * (levels - 1), stackwise_num_blocks=[1] * levels,
                   stackwise_num_strides=[1] + [2] * (levels - 1))


def _hgnetv2(**kwargs):
    return M.HGNetV2Backbone(
        depths=[1, 1], embedding_size=16, hidden_sizes=[32, 64], stem_channels=[3, 8, 16],
        hidden_act="relu", stackwise_stage_filters=[(16, 8, 32, 1, 1, 3), (32, 16, 64, 1, 1, 3)],
        apply_downsample=[False, True], use_lightweight_conv_block=[False, True],
        image_shape=(32, 32, 3), **kwargs)


def _efficientnet(block_types, se_ratios):
    """Two small EfficientNet stages of ``block_types`` (``"v1"``; V2's ``"fused"``, ``"unfused"``)."""
    return M.EfficientNetBackbone(
        stackwise_width_coefficients=[1.0, 1.0], stackwise_depth_coefficients=[1.0, 1.0],
        stackwise_kernel_sizes=[3, 3], stackwise_num_repeats=[1, 2],
        stackwise_input_filters=[16, 16], stackwise_output_filters=[16, 24],
        stackwise_expansion_ratios=[1, 4], stackwise_squeeze_and_excite_ratios=se_ratios,
        stackwise_strides=[1, 2], stackwise_block_types=block_types, num_features=64,
        input_shape=(32, 32, 3))


def _mobilenet_v5(block_types=("er", "uir", "uir"), **kwargs):
    """A small MobileNetV5 of one edge-residual stage and one universal-inverted-residual stage.

    ``block_types[2]`` may be ``"mqa"`` (multi-query attention, refused).
    """
    attention = block_types[2] == "mqa"
    config = dict(
        stackwise_block_types=[[block_types[0]], list(block_types[1:])], stackwise_num_blocks=[1, 2],
        stackwise_num_filters=[[16], [24, 24]], stackwise_strides=[[2], [2, 1]],
        stackwise_act_layers=[["relu"], ["relu", "relu"]], stackwise_exp_ratios=[[4.0], [4.0, 4.0]],
        stackwise_se_ratios=[[0.0], [0.0, 0.0]], stackwise_dw_kernel_sizes=[[0], [5, 3]],
        stackwise_dw_start_kernel_sizes=[[0], [0, 3]], stackwise_dw_end_kernel_sizes=[[0], [0, 3]],
        stackwise_exp_kernel_sizes=[[3], [0, 0]], stackwise_pw_kernel_sizes=[[1], [0, 0]],
        stackwise_num_heads=[[0], [0, 2 * attention]], stackwise_key_dims=[[0], [0, 8 * attention]],
        stackwise_value_dims=[[0], [0, 8 * attention]], stackwise_kv_strides=[[0], [0, attention]],
        stackwise_use_cpe=[[False], [False, False]], stem_size=16, use_msfa=False,
        image_shape=(32, 32, 3))
    config.update(kwargs)
    return M.MobileNetV5Backbone(**config)


BACKBONES = {
    "ResNetBackbone": lambda: _resnet(
        input_conv_kernel_sizes=[7], stackwise_num_blocks=[2, 2], block_type="bottleneck_block",
        use_pre_activation=True),
    "ResNetBackbone_basic": _resnet,
    "ResNetBackbone_vd": lambda: _resnet(block_type="bottleneck_block_vd"),
    "VGGBackbone": lambda: M.VGGBackbone(
        stackwise_num_repeats=[1, 2], stackwise_num_filters=[16, 32], image_shape=(32, 32, 3)),
    "DenseNetBackbone": lambda: M.DenseNetBackbone(
        stackwise_num_repeats=[2, 2], growth_rate=8, image_shape=(32, 32, 3)),
    "XceptionBackbone": lambda: M.XceptionBackbone(
        stackwise_conv_filters=[[32, 64], [64, 128], [128, 128], [256, 256]],
        stackwise_pooling=[False, True, False, True], image_shape=(71, 71, 3)),
    "EfficientNetBackbone": lambda: _efficientnet(["v1", "v1"], [0.25, 0.25]),
    "EfficientNetBackbone_v2": lambda: _efficientnet(["fused", "unfused"], [0.0, 0.25]),
    "MobileNetBackbone": lambda: M.MobileNetBackbone(
        stackwise_expansion=[[16, 24], [48]], stackwise_num_blocks=[2, 1],
        stackwise_num_filters=[[8, 8], [16]], stackwise_kernel_size=[[3, 3], [5]],
        stackwise_num_strides=[[2, 1], [2]], stackwise_se_ratio=[[None, None], [0.25]],
        stackwise_activation=[["relu", "relu"], ["hard_swish"]],
        stackwise_padding=[[1, 1], [2]], output_num_filters=32, depthwise_filters=8,
        depthwise_stride=1, depthwise_residual=False, last_layer_filter=32,
        squeeze_and_excite=0.5, input_num_filters=8, image_shape=(32, 32, 3)),
    "HGNetV2Backbone": lambda: _hgnetv2(use_learnable_affine_block=False),
    # The learnable affine block: a scalar scale and bias, whatever the width.
    "HGNetV2Backbone_affine": lambda: _hgnetv2(use_learnable_affine_block=True),
    # The preset's parts without attention: RMS norm over channels, GELU, the multi-scale
    # fusion adapter (resize, concatenate, a universal inverted residual, average pooling).
    "MobileNetV5Backbone": lambda: _mobilenet_v5(
        act_layer="gelu", use_msfa=True, num_features=32, msfa_output_resolution=2),
    "MobileNetV5Backbone_layer_scale": lambda: _mobilenet_v5(
        norm_layer="batch_norm", layer_scale_init_value=1e-5, drop_path_rate=0.1),
    "DeepLabV3Backbone": lambda: M.DeepLabV3Backbone(
        image_encoder=_encoder(3), spatial_pyramid_pooling_key="P4", upsampling_size=4,
        dilation_rates=[1, 2], low_level_feature_key="P2", projection_filters=8,
        image_shape=(32, 32, 3)),
    "RetinaNetBackbone": lambda: M.RetinaNetBackbone(
        image_encoder=_encoder(4), min_level=3, max_level=5, use_p5=False, image_shape=(64, 64, 3)),
    # 64 pixels: at 32 its bridge, convolutions dilated by 2, would see 1 x 1 maps, which
    # TensorFlow pads to 2 x 2 (its dilated convolution works on space-to-batch blocks), so
    # its graph would count four times their MACs.
    "BASNetBackbone": lambda: M.BASNetBackbone(
        image_encoder=_encoder(4), num_classes=1, image_shape=(64, 64, 3), projection_filters=8),
}


def _csp(stage_type, block_type, **kwargs):
    """A small CSPNet backbone; its ``csp`` and ``cs3`` stages split channels with ``keras.ops.split``."""
    config = dict(stem_filters=16, stem_kernel_size=3, stem_strides=1, stackwise_depth=[1, 1],
                  stackwise_strides=[1, 2], stackwise_num_filters=[16, 32], expand_ratio=[2.0],
                  bottle_ratio=[0.5], block_ratio=[1.0], image_shape=(32, 32, 3))
    config.update(kwargs)
    return lambda: M.CSPNetBackbone(block_type=block_type, stage_type=stage_type, **config)


CSP = {
    **{f"CSPNetBackbone_{stage}_{block}": _csp(stage, block)
       for stage in ("csp", "cs3", "dark")
       for block in ("bottleneck_block", "dark_block", "edge_block")},
    "CSPNetBackbone_csp_grouped": _csp("csp", "bottleneck_block", groups=2, down_growth=True,
                                       cross_linear=True),
    "CSPNetBackbone_cs3_pooled": _csp("cs3", "dark_block", stem_strides=4, stem_pooling="max",
                                      avg_down=True),
}
BACKBONES.update(CSP)
# Run by default: one of each family, the keras_hub-specific layers and the traced blocks; the
# task tests below build DeepLabV3, RetinaNet and BASNet backbones and prune them too.
DEFAULT = {"ResNetBackbone", "CSPNetBackbone_csp_bottleneck_block", "MobileNetV5Backbone"}
# Keras' parameter count holds layers the backbone never calls: BASNet keeps its image
# encoder, whose stem it replaces by its own convolution.
UNCALLED_PARAMS = {"BASNetBackbone": lambda backbone: sum(
    backbone.image_encoder.get_layer(name).count_params() for name in ("conv1_conv", "conv1_bn"))}

# Backbones the walker refuses, with the operation it names.
REFUSED = {
    # Attention reshapes by sizes read with ops.shape() on the symbolic batch (the gemma3n
    # preset's blocks): the trace cannot replay it, and the error names the attention layer.
    "MobileNetV5Backbone_mqa": (lambda: _mobilenet_v5(("er", "uir", "mqa")),
                                r"'mobile_attention_attn' of class MultiQueryAttention2d reshapes "
                                r"sizes it leaves open"),
}
# keras_hub 0.32 itself cannot build these from constructor arguments (an error before any
# pruning): MobileNetV5 with `se_ratios > 0` (its builder passes `filters=` to a lambda) or
# with `"mha"` blocks (`Attention2d` computes `None % int` on a symbolic batch size).


def _param(name, default=DEFAULT):
    return pytest.param(name, marks=() if name in default else pytest.mark.slow)


def _graph_params(model):
    """Keras' count of the parameters of the layers ``model``'s graph calls."""
    return keras.Model(model.input, model.output).count_params()


def _random_input(model, seed=0):
    shape = tuple(model.input.shape[1:])
    return np.random.default_rng(seed).uniform(0, 1, (2,) + shape).astype("float32")


def _assert_same_outputs(a, b, x):
    """``a`` and ``b`` compute the same outputs, to 1e-5 of their magnitude (at least 1)."""
    keras.tree.map_structure(
        lambda u, v: np.testing.assert_allclose(u, v, atol=1e-5 * max(1.0, float(np.abs(u).max()))),
        a(x, training=False), b(x, training=False))


def _assert_reloads(model, path, **options):
    """``model`` saved to ``path`` (``.keras``) loads back computing the same outputs."""
    model.save(path)
    loaded = keras.models.load_model(path, **options)
    assert type(loaded) is type(model)
    _assert_same_outputs(model, loaded, _random_input(model))


@pytest.mark.parametrize("name", [_param(n) for n in sorted(BACKBONES)])
def test_backbone_profile_precrop_reconfigure_and_reload(name, tmp_path):
    backbone = BACKBONES[name]()
    prof = kp.profile(backbone)
    uncalled = UNCALLED_PARAMS.get(name, lambda _: 0)(backbone)
    assert prof.total_params == _graph_params(backbone) == backbone.count_params() - uncalled
    assert prof.total_macs == tf_macs(backbone)
    traced = trace.traced(backbone)
    names = sorted(traced.name(layer) for layer in traced.functional.layers)
    for new in (kp.precrop(backbone, params=0.5), kp.precrop(backbone, flops=0.5),
                kp.reconfigure(backbone, params=0.8, flops=1.0)):
        assert_matches_plan(backbone, new.precrop_plan, new)
        assert sorted(layer.name for layer in new.layers if not isinstance(layer, kp.ChannelSlice)) == names
    _assert_reloads(new, tmp_path / "pruned.keras")


@pytest.mark.parametrize("name", [_param(n, {"CSPNetBackbone_csp_bottleneck_block"}) for n in sorted(CSP)])
def test_pruned_csp_backbone_trains_one_step(name):
    """The pruned backbone under a classifier head takes an optimizer step on random data."""
    keras.utils.set_random_seed(0)
    small = kp.precrop(CSP[name](), params=0.5)
    inputs = keras.Input(small.input.shape[1:])
    logits = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(small(inputs)))
    model = keras.Model(inputs, logits)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    _assert_one_step(model, small, _random_input(small), np.array([0, 2]))


def _assert_one_step(model, part, x, y):
    """One ``fit`` step of ``model`` on ``(x, y)``: a finite loss, and ``part``'s weights move."""
    before = [keras.ops.convert_to_numpy(w) for w in part.trainable_weights]
    history = model.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [keras.ops.convert_to_numpy(w) for w in part.trainable_weights]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_backbone_refused_names_the_operation(name):
    build, where = REFUSED[name]
    with pytest.raises(kp.UnsupportedLayerError, match=where):
        kp.profile(build())


# -- task models ----------------------------------------------------------------


def _classifier(cls, backbone, **kwargs):
    return lambda: getattr(M, cls)(backbone=BACKBONES[backbone](), num_classes=3,
                                   preprocessor=None, **kwargs)


def _labels(x):
    return np.array([0, 2])


def _masks(x):
    """One-hot masks of 3 classes (the segmenter's default loss is a categorical cross-entropy)."""
    return np.eye(3, dtype="float32")[np.random.default_rng(0).integers(0, 3, x.shape[:3])]


def _saliency(x):
    return (np.random.default_rng(0).uniform(size=x.shape[:3] + (1,)) > 0.5).astype("float32")


def _boxes(x):
    """Two boxes (``yxyx`` pixels) with classes per image, the detector's training format."""
    boxes = np.array([[[4, 4, 30, 30], [20, 24, 60, 56]]] * len(x), "float32")
    return {"boxes": boxes, "labels": np.array([[0, 2]] * len(x))}


# Task -> (builder, labels for a batch of images in the task's format).
TASKS = {
    **{f"{family}ImageClassifier": (_classifier(f"{family}ImageClassifier", f"{family}Backbone",
                                                **kwargs), _labels)
       for family, kwargs in (("ResNet", {}), ("VGG", {"pooling_hidden_dim": 16}),
                              ("DenseNet", {}), ("Xception", {}), ("EfficientNet", {}),
                              ("MobileNet", {"num_features": 16}), ("HGNetV2", {"head_filters": 16}),
                              ("MobileNetV5", {"head_hidden_size": 16}))},
    "CSPNetImageClassifier": (_classifier("CSPNetImageClassifier",
                                          "CSPNetBackbone_csp_bottleneck_block"), _labels),
    "DeepLabV3ImageSegmenter": (lambda: M.DeepLabV3ImageSegmenter(
        backbone=BACKBONES["DeepLabV3Backbone"](), num_classes=3), _masks),
    "RetinaNetObjectDetector": (lambda: M.RetinaNetObjectDetector(
        backbone=BACKBONES["RetinaNetBackbone"](), num_classes=3, pre_logits_num_conv_layers=1),
        _boxes),
    "BASNetImageSegmenter": (lambda: M.BASNetImageSegmenter(
        backbone=BACKBONES["BASNetBackbone"]()), _saliency),
}
DEFAULT_TASKS = {"ResNetImageClassifier"}


@pytest.mark.parametrize("name", [_param(n, DEFAULT_TASKS) for n in sorted(TASKS)])
def test_pruned_task_keeps_its_class_and_trains_with_its_own_loss(name, tmp_path):
    build, labels = TASKS[name]
    task = build()
    head = task.count_params() - task.backbone.count_params()
    for new in (kp.hub.precrop(task, params=0.5), kp.hub.precrop(task, flops=0.5),
                kp.hub.reconfigure(task, params=0.8, flops=1.0)):
        assert type(new) is type(task) and isinstance(new.backbone, kp.hub.PrunedBackbone)
        assert_matches_plan(task.backbone, new.precrop_plan, new.backbone)
        assert new.count_params() - new.backbone.count_params() == head
    # The task's own defaults: optimizer, loss (RetinaNet's box and focal losses), metrics.
    # Eager: for one step, tracing the training function would take most of the time.
    new.compile(run_eagerly=True)
    x = _random_input(new) * 255
    _assert_one_step(new, new.backbone, x, labels(x))
    _assert_reloads(new, tmp_path / "task.keras")


def test_apply_plan_gives_a_task_the_planned_backbone():
    task = TASKS["ResNetImageClassifier"][0]()
    plan = kp.plan(kp.hub.backbone_of(task), params=0.5)
    new = kp.hub.apply_plan(task, plan)
    assert type(new) is type(task) and new.precrop_plan is plan
    assert new.backbone.count_params() == plan.params
    assert kp.hub.precrop(task.backbone, params=0.5).count_params() == plan.params


# -- kept weights (issue 42) ------------------------------------------------------


def _head(task):
    """The task's weights outside its backbone, as arrays."""
    inside = {id(w) for w in task.backbone.weights}
    return [np.asarray(w) for w in task.weights if id(w) not in inside]


@pytest.mark.parametrize("name", [_param(n, {"ResNetImageClassifier", "DeepLabV3ImageSegmenter"}) for n in (
    "ResNetImageClassifier", "RetinaNetObjectDetector", "DeepLabV3ImageSegmenter", "CSPNetImageClassifier")])
def test_kept_weights_carry_the_task_head(name):
    """``weights="keep"``: a plan that keeps every width gives the original task's outputs; a
    pruned task (``apply_plan``) keeps the head's trained weights as they are."""
    task = randomize(TASKS[name][0]())  # random biases and statistics, so a fresh head shows
    x = _random_input(task) * 255
    same = kp.hub.precrop(task, params=1.0, weights="keep")
    assert all(v["new"] == v["width"] for v in same.precrop_plan.variables)
    _assert_same_outputs(task, same, x)
    small = kp.hub.apply_plan(task, kp.plan(task.backbone, params=0.5), weights="keep", importance="l2")
    assert small.backbone.count_params() < task.backbone.count_params()
    for a, b in zip(_head(task), _head(small), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_pruned_classifier_head_reads_the_channels_the_backbone_keeps():
    """The head's kernel is the original's at the backbone's kept output channels (its last
    normalization writes them), and the task computes that head on the pruned features."""
    task = randomize(TASKS["ResNetImageClassifier"][0](), kernels=True)
    small = kp.hub.precrop(task, params=0.5, weights="keep")
    norm = [layer.name for layer in task.backbone.layers
            if isinstance(layer, keras.layers.BatchNormalization)][-1]
    (kept,) = gathered_indices(*(np.asarray(m.backbone.get_layer(norm).gamma) for m in (task, small)))
    head = [m.get_layer("predictions") for m in (task, small)]
    np.testing.assert_array_equal(np.asarray(head[1].kernel), np.asarray(head[0].kernel)[kept])
    x = _random_input(task)
    features = keras.layers.GlobalAveragePooling2D()(small.backbone(x, training=False))
    np.testing.assert_allclose(np.asarray(small(x, training=False)), np.asarray(head[0](features)),
                               rtol=1e-5, atol=1e-5 * float(np.abs(head[0](features)).max()))


def test_hub_refuses_taylor_importance():
    task = TASKS["ResNetImageClassifier"][0]()
    x = _random_input(task)
    with pytest.raises(kp.ArgumentError, match="importance='taylor'.*backbone"):
        kp.hub.precrop(task, params=0.5, weights="keep", importance="taylor", data=(x, _labels(x)))
    with pytest.raises(kp.ArgumentError, match="importance='taylor'"):
        kp.hub.apply_plan(task, kp.plan(task.backbone, params=0.5), weights="keep",
                          importance="taylor", data=(x, _labels(x)))


@pytest.mark.parametrize("name", [_param(n, {"CSPNetBackbone_csp_bottleneck_block"}) for n in sorted(CSP)])
def test_kept_weights_through_csp_splits(name):
    """CSPNet splits its stages' channels with ``keras.ops.split``: a plan that keeps every width
    and one that only widens compute the original's outputs; a pruned one keeps slices."""
    backbone = randomize(CSP[name]())
    x = _random_input(backbone)
    plan = kp.plan(backbone, params=1.0)
    assert all(v["new"] == v["width"] for v in plan.variables)
    assert_same_function(backbone, kp.apply_plan(backbone, plan, weights="keep"), x)
    wide = kp.reconfigure(backbone, params=1.5, mode="uniform", weights="keep")
    assert any(v["new"] > v["width"] for v in wide.precrop_plan.variables)
    assert_same_function(backbone, wide, x)
    small = kp.precrop(randomize(backbone, kernels=True), params=0.5, weights="keep")
    assert_matches_plan(backbone, small.precrop_plan, small)
    assert_sliced(backbone, small)
