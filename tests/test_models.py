"""Tests for keras_precrop.models: structure, parameter counts, init, forward passes."""

import functools

import keras
import numpy as np
import pytest

from keras_precrop import models

CIFAR_NAMES = [
    "resnet20", "resnet32", "resnet44", "resnet56", "resnet110",
    "wide_resnet20", "vgg16", "mobilenet_v2_cifar",
]
IMAGENET_NAMES = ["resnet18", "resnet34", "mobilenet_v2", "efficientnet_b0"]
ALL_NAMES = CIFAR_NAMES + IMAGENET_NAMES
OWN_BUILDERS = CIFAR_NAMES + ["resnet18", "resnet34"]  # keras.applications ones excluded

# Published PyTorch parameter counts (torchvision model docs, He et al./open_lth ResNet-20).
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "mobilenet_v2": 3_504_872,
    "efficientnet_b0": 5_288_548,
}


@functools.cache
def _default_model(name):
    """Builds each default model once per session (tests only read it)."""
    keras.utils.set_random_seed(0)
    return models.get(name)


def _trainable_count(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def _bn_channels(model):
    return sum(
        layer.gamma.shape[0]
        for layer in model.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    )


def _basic_resnet_params(stem_kernel, widths, blocks, num_classes):
    """(trainable params, BN channels) of a basic-block ResNet, by hand.

    Stem conv (3 -> widths[0]) + BN, then per block two 3x3 convs + 2 BN and,
    where the channel count changes, a 1x1 projection + BN; Dense with bias.
    BN contributes gamma and beta (2 per channel) to the trainable count.
    """
    conv = stem_kernel**2 * 3 * widths[0]
    bn = widths[0]
    c_in = widths[0]
    for c, n in zip(widths, blocks):
        for _ in range(n):
            conv += 9 * c_in * c + 9 * c * c
            bn += 2 * c
            if c_in != c:
                conv += c_in * c
                bn += c
            c_in = c
    return conv + 2 * bn + c_in * num_classes + num_classes, bn


def _cifar_resnet_expected(name):
    depth, width = (20, 32) if name == "wide_resnet20" else (int(name[len("resnet"):]), 16)
    n = (depth - 2) // 6
    return _basic_resnet_params(3, (width, 2 * width, 4 * width), (n, n, n), 10)


def test_list_names_all_models_sorted():
    assert models.list() == sorted(ALL_NAMES)
    assert models.list_models() == models.list()


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="nope") as info:
        models.get("nope")
    for name in ALL_NAMES:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="Unknown model"):
        models.get(["resnet20"])


@pytest.mark.parametrize("name", ALL_NAMES)
def test_default_build_shapes_and_name(name):
    model = _default_model(name)
    expected_input, expected_classes = (
        ((32, 32, 3), 10) if name in CIFAR_NAMES else ((224, 224, 3), 1000)
    )
    assert model.name == name
    assert tuple(model.input_shape[1:]) == expected_input
    assert tuple(model.output_shape) == (None, expected_classes)
    assert not model.compiled
    last = model.layers[-1]
    assert isinstance(last, keras.layers.Dense)
    assert last.activation is keras.activations.linear  # logits


@pytest.mark.parametrize("name", ALL_NAMES)
def test_forward_pass_custom_classes_and_shape(name):
    # Non-square, non-default sizes check that nothing hard-codes 32 or 224.
    shape = (40, 48, 3) if name in CIFAR_NAMES else (64, 72, 3)
    batch = 2 if name in CIFAR_NAMES else 1
    model = models.get(name, input_shape=shape, num_classes=7)
    x = np.random.default_rng(0).normal(size=(batch,) + shape).astype("float32")
    y = keras.ops.convert_to_numpy(model(x, training=False))
    assert y.shape == (batch, 7)
    assert np.all(np.isfinite(y))
    assert np.std(y) > 0


@pytest.mark.parametrize(
    "name", ["resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "wide_resnet20"]
)
def test_cifar_resnet_param_counts(name):
    model = _default_model(name)
    trainable, bn = _cifar_resnet_expected(name)
    assert _trainable_count(model) == trainable
    assert model.count_params() == trainable + 2 * bn  # + BN moving mean/var


def test_resnet20_matches_published_count():
    # open_lth / Synaptic-Flow ResNet-20 (PyTorch count incl. BN affine params).
    assert _cifar_resnet_expected("resnet20")[0] == 272_474
    assert _trainable_count(_default_model("resnet20")) == 272_474


@pytest.mark.parametrize("name", ["resnet18", "resnet34"])
def test_imagenet_resnet_param_counts(name):
    model = _default_model(name)
    blocks = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}[name]
    trainable, bn = _basic_resnet_params(7, (64, 128, 256, 512), blocks, 1000)
    assert trainable == TORCHVISION_PARAMS[name]
    assert _trainable_count(model) == TORCHVISION_PARAMS[name]
    assert model.count_params() == trainable + 2 * bn


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0"])
def test_keras_application_trainable_counts_match_torchvision(name):
    assert _trainable_count(_default_model(name)) == TORCHVISION_PARAMS[name]


def test_vgg16_param_count():
    plan = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    c_in, conv, bn = 3, 0, 0
    for c in plan:
        conv += 9 * c_in * c + c  # open_lth VGG convs have a bias
        bn += c
        c_in = c
    trainable = conv + 2 * bn + 512 * 10 + 10
    model = _default_model("vgg16")
    assert _trainable_count(model) == trainable
    assert model.count_params() == trainable + 2 * bn


def test_mobilenet_v2_cifar_param_count():
    # (t, c, n) of the paper's Table 2; the CIFAR strides do not change counts.
    table = [(1, 16, 1), (6, 24, 2), (6, 32, 3), (6, 64, 4), (6, 96, 3), (6, 160, 3), (6, 320, 1)]
    conv, bn, c_in = 9 * 3 * 32, 32, 32
    for t, c, n in table:
        for _ in range(n):
            hidden = c_in * t
            if t != 1:
                conv += c_in * hidden
                bn += hidden
            conv += 9 * hidden + hidden * c
            bn += hidden + c
            c_in = c
    conv += c_in * 1280
    bn += 1280
    trainable = conv + 2 * bn + 1280 * 10 + 10
    model = _default_model("mobilenet_v2_cifar")
    assert _trainable_count(model) == trainable
    assert model.count_params() == trainable + 2 * bn
    # With 1000 classes it is torchvision's mobilenet_v2 parameter for parameter.
    assert trainable - 1281 * 10 + 1281 * 1000 == TORCHVISION_PARAMS["mobilenet_v2"]


@pytest.mark.parametrize("alpha", [0.5, 0.75, 1.4])
def test_mobilenet_v2_cifar_alpha_matches_keras_applications(alpha):
    ours = models.mobilenet_v2_cifar(num_classes=1000, alpha=alpha)
    reference = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=alpha, weights=None, classes=1000
    )
    assert ours.count_params() == reference.count_params()
    assert _trainable_count(ours) == _trainable_count(reference)
    assert ours.get_layer("head_conv").filters == (1792 if alpha > 1 else 1280)


@pytest.mark.parametrize("name", OWN_BUILDERS)
def test_count_params_is_trainable_plus_bn_statistics(name):
    model = _default_model(name)
    assert model.count_params() == _trainable_count(model) + 2 * _bn_channels(model)


@pytest.mark.parametrize(
    "name,blocks", [("resnet18", (2, 2, 2, 2)), ("resnet34", (3, 4, 6, 3))]
)
def test_imagenet_resnet_spatial_sizes_and_macs(name, blocks):
    model = _default_model(name)
    assert model.get_layer("stem_conv").output.shape[1:] == (112, 112, 64)
    assert model.get_layer("stem_pool").output.shape[1:] == (56, 56, 64)
    for stage, (size, channels, n) in enumerate(
        zip((56, 28, 14, 7), (64, 128, 256, 512), blocks), start=1
    ):
        out = model.get_layer(f"stage{stage}_block{n}_out_relu").output
        assert out.shape[1:] == (size, size, channels)
    macs = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, c_in, c_out = layer.kernel.shape
            _, h, w, _ = layer.output.shape
            macs += kh * kw * c_in * c_out * h * w
        elif isinstance(layer, keras.layers.Dense):
            macs += int(np.prod(layer.kernel.shape))
    # torchvision's published GFLOPS (multiply-accumulates): 1.81 and 3.66.
    assert round(macs / 1e9, 2) == {"resnet18": 1.81, "resnet34": 3.66}[name]


def test_resnet20_layer_names():
    expected = {"input", "stem_conv", "stem_bn", "stem_relu", "pool", "classifier"}
    for stage in (1, 2, 3):
        for block in (1, 2, 3):
            p = f"stage{stage}_block{block}_"
            parts = ("conv1", "bn1", "relu1", "conv2", "bn2", "add", "out_relu")
            expected |= {p + s for s in parts}
            if stage > 1 and block == 1:
                expected |= {p + "pad1", p + "shortcut_conv", p + "shortcut_bn"}
    names = [layer.name for layer in models.get("resnet20").layers]
    assert len(names) == len(set(names))
    assert set(names) == expected
    # Stable across builds (no auto-numbered names like conv2d_17).
    assert [layer.name for layer in models.get("resnet20").layers] == names


def test_other_models_layer_names():
    vgg_names = {layer.name for layer in _default_model("vgg16").layers}
    assert {f"block{b}_pool" for b in (1, 2, 3, 4)} <= vgg_names
    assert {"block1_conv1", "block1_bn2", "block5_conv3", "block5_relu3"} <= vgg_names
    assert "block5_pool" not in vgg_names and "block5_conv4" not in vgg_names

    resnet34 = {layer.name for layer in _default_model("resnet34").layers}
    assert {"stem_pad", "stem_pool_pad", "stage4_block3_out_relu"} <= resnet34
    assert {f"stage{s}_block1_shortcut_conv" for s in (2, 3, 4)} <= resnet34
    assert "stage1_block1_shortcut_conv" not in resnet34

    mobilenet = {layer.name for layer in _default_model("mobilenet_v2_cifar").layers}
    assert "stage1_block1_expand_conv" not in mobilenet  # t = 1
    block = "stage2_block1_"
    assert {block + "expand_conv", block + "dw_conv", block + "project_bn"} <= mobilenet
    assert "stage2_block2_add" in mobilenet and "stage2_block1_add" not in mobilenet
    assert {"head_conv", "pool", "classifier"} <= mobilenet


def test_mobilenet_v2_cifar_keeps_resolution_early():
    model = _default_model("mobilenet_v2_cifar")
    assert model.get_layer("stem_conv").output.shape[1:3] == (32, 32)
    assert model.get_layer("stage2_block2_add").output.shape[1:3] == (32, 32)
    assert model.get_layer("head_relu").output.shape[1:] == (4, 4, 1280)


def _torch_conv2d(x, kernel, stride, pad):
    """Reference conv with PyTorch semantics: symmetric zero padding, no flip."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw = kernel.shape[:2]
    h = (x.shape[1] - kh) // stride + 1
    w = (x.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], h, w, kernel.shape[3]))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i : i + stride * h : stride, j : j + stride * w : stride, :]
            out += np.einsum("bhwc,cd->bhwd", patch, kernel[i, j])
    return out


@pytest.mark.parametrize(
    "name,pad_layer,conv_layer,pad",
    [
        ("resnet20", "stage2_block1_pad1", "stage2_block1_conv1", 1),
        ("resnet18", "stem_pad", "stem_conv", 3),
    ],
)
def test_strided_convs_pad_like_pytorch(name, pad_layer, conv_layer, pad):
    model = _default_model(name)
    sub = keras.Model(model.get_layer(pad_layer).input, model.get_layer(conv_layer).output)
    x = np.random.default_rng(1).normal(size=(1,) + sub.input_shape[1:]).astype("float32")
    kernel = model.get_layer(conv_layer).kernel.numpy()
    expected = _torch_conv2d(x.astype("float64"), kernel.astype("float64"), 2, pad)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sub(x)), expected, rtol=1e-4, atol=1e-4)


def _assert_kaiming_normal(kernel, fan):
    kernel = np.asarray(kernel).ravel()
    std = np.sqrt(2.0 / fan)
    assert abs(kernel.mean()) < 0.05 * std
    assert abs(kernel.std() / std - 1) < 0.05
    # Untruncated: Keras' truncated normal never exceeds ~2.3 std.
    assert np.abs(kernel).max() > 3.0 * std


def test_initializers_match_pytorch_references():
    resnet20 = _default_model("resnet20")
    _assert_kaiming_normal(resnet20.get_layer("stage3_block2_conv2").kernel, fan=9 * 64)
    a = np.asarray(resnet20.get_layer("stage1_block1_conv1").kernel)
    b = np.asarray(resnet20.get_layer("stage1_block1_conv2").kernel)
    assert not np.allclose(a, b)  # one initializer instance per layer
    dense = resnet20.get_layer("classifier")
    assert abs(np.std(np.asarray(dense.kernel)) / np.sqrt(2 / 64) - 1) < 0.15  # 640 samples
    assert np.all(np.asarray(dense.bias) == 0)
    bn = resnet20.get_layer("stage2_block1_bn1")
    assert np.all(np.asarray(bn.gamma) == 1) and np.all(np.asarray(bn.beta) == 0)

    resnet18 = _default_model("resnet18")  # torchvision: fan_out
    _assert_kaiming_normal(resnet18.get_layer("stage4_block2_conv1").kernel, fan=9 * 512)
    bound = 1 / np.sqrt(512)
    for w in resnet18.get_layer("classifier").weights:
        w = np.asarray(w)
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound

    mobilenet = _default_model("mobilenet_v2_cifar")
    # torchvision fan_out of a (C, 1, 3, 3) depthwise weight is 9 * C.
    _assert_kaiming_normal(mobilenet.get_layer("stage6_block1_dw_conv").kernel, fan=9 * 576)
    _assert_kaiming_normal(mobilenet.get_layer("stage6_block1_project_conv").kernel, fan=160)
    assert abs(np.std(np.asarray(mobilenet.get_layer("classifier").kernel)) - 0.01) < 0.001


def test_save_load_round_trip(tmp_path):
    for name in ("resnet20", "mobilenet_v2_cifar"):
        model = _default_model(name)
        path = tmp_path / f"{name}.keras"
        model.save(path)
        loaded = keras.models.load_model(path)
        x = np.random.default_rng(2).normal(size=(2, 32, 32, 3)).astype("float32")
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(loaded(x, training=False)),
            keras.ops.convert_to_numpy(model(x, training=False)),
            atol=1e-5,
        )
        assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: models.cifar_resnet(depth=21), "depth"),
        (lambda: models.cifar_resnet(depth=2), "depth"),
        (lambda: models.cifar_resnet(width=0), "width"),
        (lambda: models.get("resnet20", num_classes=0), "num_classes"),
        (lambda: models.get("resnet20", num_classes=2.5), "num_classes"),
        (lambda: models.get("resnet20", input_shape=(32, 32)), "input_shape"),
        (lambda: models.get("resnet20", input_shape=(32, -1, 3)), "input_shape"),
        (lambda: models.get("vgg16", input_shape=(8, 8, 3)), "at least 16"),
        (lambda: models.vgg(plan=(64, "X")), "'X'"),
        (lambda: models.vgg(plan=("M",)), "no conv"),
        (lambda: models.imagenet_resnet(blocks_per_stage=(2, 2, 2)), "blocks_per_stage"),
        (lambda: models.mobilenet_v2_cifar(alpha=-1.0), "alpha"),
        (lambda: models.get("mobilenet_v2", num_classes=0), "num_classes"),
    ],
)
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_channels_first_config_is_rejected():
    keras.config.set_image_data_format("channels_first")
    try:
        with pytest.raises(ValueError, match="channels_last"):
            models.get("resnet20")
    finally:
        keras.config.set_image_data_format("channels_last")
