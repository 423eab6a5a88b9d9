"""Tests for keras_precrop.data against numpy references.

CIFAR-10 tests read the real dataset prepared in ``../shared/tfds`` (beside the
repository) and skip when it is absent; ImageNet is tested on synthetic
images and on TFDS' mock data, since the real dataset is not available.
"""

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from keras_precrop import data, models  # noqa: E402

TFDS_DIR = Path(__file__).resolve().parents[2] / "shared" / "tfds"
needs_cifar = pytest.mark.skipif(
    not (TFDS_DIR / "cifar10").is_dir(),
    reason=f"real CIFAR-10 is not prepared at {TFDS_DIR} (expected ../shared/tfds beside the repo)",
)

CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465])
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616])
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def _raw_cifar(split, count):
    ds = tfds.load("cifar10", split=split, data_dir=str(TFDS_DIR), download=False)
    examples = list(tfds.as_numpy(ds.take(count)))
    return np.stack([e["image"] for e in examples]), np.array([e["label"] for e in examples])


def _normalized(images, mean, std):
    return (images.astype(np.float64) / 255.0 - mean) / std


# ----------------------------------------------------------------- CIFAR-10


@needs_cifar
def test_cifar_eval_batches_are_normalized_test_images_in_order():
    images, labels = _raw_cifar("test", 100)
    batch_images, batch_labels = next(iter(data.load("cifar10", "test", 100, data_dir=str(TFDS_DIR))))
    assert batch_images.shape == (100, 32, 32, 3) and batch_images.dtype == tf.float32
    assert batch_labels.dtype == tf.int32
    np.testing.assert_array_equal(batch_labels.numpy(), labels)
    np.testing.assert_allclose(batch_images.numpy(), _normalized(images, CIFAR_MEAN, CIFAR_STD), atol=1e-5)


@needs_cifar
def test_cifar_constants_are_the_training_set_statistics():
    # The constants are the Synaptic-Flow codebase's; the exact full-set std
    # is (0.2452, 0.2428, 0.2606), hence the tolerance.
    images, _ = _raw_cifar("train[:10000]", 10000)
    images = images.astype(np.float64) / 255.0
    info = data.get_info("cifar10")
    np.testing.assert_allclose(info.mean, images.mean(axis=(0, 1, 2)), atol=3e-3)
    np.testing.assert_allclose(info.std, images.std(axis=(0, 1, 2)), atol=3e-3)


@needs_cifar
def test_cifar_train_augmentation_is_a_padded_crop_and_flip():
    images, labels = _raw_cifar("train", 24)
    fn = data.preprocess_fn("cifar10", training=True)
    padded = np.pad(_normalized(images, CIFAR_MEAN, CIFAR_STD), [(0, 0), (4, 4), (4, 4), (0, 0)])
    # Zero padding happens on raw pixels, so padded pixels normalize to -mean/std.
    padded[:, :4] = padded[:, -4:] = padded[:, :, :4] = padded[:, :, -4:] = -CIFAR_MEAN / CIFAR_STD
    seen_offsets, seen_flips = set(), set()
    for i, (image, label) in enumerate(zip(images, labels)):
        out, out_label = fn(tf.constant(image), tf.constant(label), tf.constant([i, 7], tf.int64))
        assert int(out_label) == label
        matches = [
            (dy, dx, flip)
            for dy in range(9)
            for dx in range(9)
            for flip in (False, True)
            if np.allclose(
                out.numpy(),
                (
                    padded[i, dy : dy + 32, dx : dx + 32][:, ::-1]
                    if flip
                    else padded[i, dy : dy + 32, dx : dx + 32]
                ),
                atol=1e-5,
            )
        ]
        assert matches, f"image {i} is no flipped/unflipped window of the padded original"
        seen_offsets.add(matches[0][:2])
        seen_flips.add(matches[0][2])
    assert len(seen_offsets) > 5 and seen_flips == {False, True}


@needs_cifar
def test_cifar_train_pipeline_is_seeded_and_reshuffles_each_epoch():
    def first_batches(seed):
        ds = data.load("cifar10", "train[:256]", 32, data_dir=str(TFDS_DIR), seed=seed)
        assert ds.cardinality() == 8
        epochs = [[(x.numpy(), y.numpy()) for x, y in ds] for _ in range(2)]
        return epochs

    a, b = first_batches(3), first_batches(3)
    for (xa, ya), (xb, yb) in zip(a[0] + a[1], b[0] + b[1]):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a[0][0][1], a[1][0][1]), "the second epoch has the same order"
    labels = np.concatenate([y for _, y in a[0]])
    _, raw_labels = _raw_cifar("train[:256]", 256)
    assert sorted(labels) == sorted(raw_labels)  # a permutation of the split
    assert not np.array_equal(labels, raw_labels)


@needs_cifar
def test_cifar_train_batches_drop_remainder_and_eval_keeps_it():
    train = data.load("cifar10", "train[:100]", 32, data_dir=str(TFDS_DIR), seed=0)
    assert [x.shape[0] for x, _ in train] == [32, 32, 32]
    test = data.load("cifar10", "test[:100]", 32, data_dir=str(TFDS_DIR))
    assert [x.shape[0] for x, _ in test] == [32, 32, 32, 4]


# ------------------------------------------------------- ImageNet (synthetic)


def _eval(image, normalize=True):
    fn = data.preprocess_fn("imagenet2012", training=False, normalize=normalize)
    out, _ = fn(tf.constant(image), tf.constant(3, tf.int64), tf.constant([0, 0], tf.int64))
    return out.numpy()


def test_imagenet_eval_center_crop_without_resize():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(256, 384, 3), dtype=np.uint8)  # shorter side already 256
    expected = _normalized(image[16:240, 80:304], IMAGENET_MEAN, IMAGENET_STD)
    np.testing.assert_allclose(_eval(image), expected, atol=1e-5)


def test_imagenet_eval_halves_a_512_image_then_crops():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, size=(512, 512, 3), dtype=np.uint8)
    # Bilinear 2x downscaling samples midway between pixel pairs: 2x2 block means.
    halved = image.astype(np.float64).reshape(256, 2, 256, 2, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(_eval(image, normalize=False), halved[16:240, 16:240], atol=1e-3)


def test_imagenet_accepts_encoded_images():
    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, size=(300, 260, 3), dtype=np.uint8)
    encoded = tf.io.encode_png(image).numpy()  # lossless
    np.testing.assert_array_equal(_eval(encoded), _eval(image))


@pytest.mark.parametrize("shape", [(20, 30), (300, 200), (224, 224), (500, 375)])
def test_imagenet_train_crop_shapes_and_content(shape):
    color = np.array([10, 128, 250], np.uint8)
    image = np.broadcast_to(color, (*shape, 3)).copy()
    fn = data.preprocess_fn("imagenet2012", training=True)
    for seed in range(3):
        out, label = fn(tf.constant(image), tf.constant(5, tf.int64), tf.constant([seed, 1], tf.int64))
        assert out.shape == (224, 224, 3) and out.dtype == tf.float32 and int(label) == 5
        # A crop of a constant image is that constant, normalized.
        np.testing.assert_allclose(
            out.numpy(),
            np.broadcast_to(_normalized(color, IMAGENET_MEAN, IMAGENET_STD), out.shape),
            atol=1e-4,
        )


def test_imagenet_train_crop_covers_8_to_100_percent_and_flips():
    # Row/column index image (float, to go past 255): the crop's edges reveal the sampled box.
    h, w = 240, 320
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    image = np.stack([rows, cols, np.zeros_like(rows)], axis=-1).astype(np.float32)
    fn = data.preprocess_fn("imagenet2012", training=True, normalize=False)
    areas, flipped = [], []
    for seed in range(40):
        out, _ = fn(tf.constant(image), tf.constant(0), tf.constant([seed, 2], tf.int64))
        out = out.numpy()
        height = out[-1, :, 0].mean() - out[0, :, 0].mean()
        width = abs(out[:, -1, 1].mean() - out[:, 0, 1].mean())
        # Output pixel centers span 223/224 of the box (less when upscaling clamps at its edges).
        areas.append((height * 224 / 223) * (width * 224 / 223) / (h * w))
        flipped.append(out[:, -1, 1].mean() < out[:, 0, 1].mean())
    assert min(areas) >= 0.05 and max(areas) <= 1.0 + 1e-3
    assert max(areas) - min(areas) > 0.3
    assert any(flipped) and not all(flipped)


def _synthetic_examples(count, seed=0):
    """A TFDS-shaped dataset: uint8 images of varying sizes and int64 labels."""
    rng = np.random.default_rng(seed)
    sizes = [(int(rng.integers(40, 300)), int(rng.integers(40, 300))) for _ in range(count)]

    def gen():
        for i, (h, w) in enumerate(sizes):
            yield {"image": rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), "label": np.int64(i % 1000)}

    return tf.data.Dataset.from_generator(
        gen,
        output_signature={
            "image": tf.TensorSpec((None, None, 3), tf.uint8),
            "label": tf.TensorSpec((), tf.int64),
        },
    )


@pytest.mark.parametrize("training", [True, False])
def test_imagenet_make_pipeline_on_synthetic_data(training):
    ds = data.make_pipeline(
        _synthetic_examples(7), "imagenet2012", 3, training=training, seed=0, shuffle_buffer=4
    )
    batches = list(ds)
    assert [tuple(x.shape) for x, _ in batches] == [
        (n, 224, 224, 3) for n in ([3, 3] if training else [3, 3, 1])
    ]
    labels = np.concatenate([y.numpy() for _, y in batches])
    assert labels.dtype == np.int32
    if not training:
        np.testing.assert_array_equal(labels, np.arange(7))
    for x, _ in batches:
        x = x.numpy()
        assert np.isfinite(x).all()
        lo, hi = (0 - IMAGENET_MEAN) / IMAGENET_STD, (1 - IMAGENET_MEAN) / IMAGENET_STD
        assert (x >= lo - 1e-4).all() and (x <= hi + 1e-4).all()


def test_imagenet_load_through_tfds_mock_data():
    with tfds.testing.mock_data(num_examples=6):
        train = data.load("imagenet2012", "train", 4, data_dir="/nonexistent", seed=1)
        evaluation = data.load("imagenet2012", "validation", 4, data_dir="/nonexistent")
        assert [x.shape for x, _ in train] == [(4, 224, 224, 3)]
        assert [x.shape for x, _ in evaluation] == [(4, 224, 224, 3), (2, 224, 224, 3)]


# -------------------------------------------------------------- misc / errors


def test_model_rescales_inputs():
    assert data.model_rescales_inputs(models.get("efficientnet_b0", input_shape=(32, 32, 3), num_classes=10))
    assert not data.model_rescales_inputs(models.get("resnet20"))
    inputs = keras.Input((8, 8, 3))
    assert not data.model_rescales_inputs(keras.Model(inputs, keras.layers.Conv2D(2, 1)(inputs)))


def test_dataset_info():
    info = data.get_info("imagenet2012")
    assert (info.num_classes, info.input_shape, info.eval_split) == (1000, (224, 224, 3), "validation")
    assert data.get_info("cifar10").input_shape == (32, 32, 3)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="'mnist'"):
        data.get_info("mnist")
    with pytest.raises(ValueError, match="'mnist'"):
        data.preprocess_fn("mnist", training=True)
    with pytest.raises(ValueError, match="batch_size.*0"):
        data.make_pipeline(_synthetic_examples(2), "imagenet2012", 0, training=False)
    with pytest.raises(ValueError, match="shuffle_buffer.*-1"):
        data.make_pipeline(_synthetic_examples(2), "imagenet2012", 2, training=True, shuffle_buffer=-1)
