"""tf.data input pipelines for CIFAR-10 and ImageNet from TensorFlow Datasets.

The pipelines reproduce the seed paper's (PyTorch) preprocessing:

* CIFAR-10: training images are zero-padded by 4 pixels, randomly cropped back
  to 32x32 and randomly flipped; every image is scaled to [0, 1] and
  normalized with the per-channel mean/std of the training set.
* ImageNet (``imagenet2012``): training uses the Inception-style random
  resized crop (8%-100% of the area, aspect ratio 3/4-4/3) to 224x224 plus a
  random flip; evaluation resizes the shorter side to 256 and takes the
  central 224x224 crop; both are normalized with the ImageNet mean/std.

Loading is split from preprocessing so each part can be tested alone:
``preprocess_fn`` gives the per-example function, ``make_pipeline`` turns any
dataset of ``{"image": uint8 HxWx3, "label": int}`` dicts into batches, and
``load`` is a thin ``tfds.load`` wrapper around it. Random augmentations use
stateless ops seeded from ``tf.data.Dataset.random``, so a ``seed`` makes a
pipeline reproducible while every epoch still sees new crops and flips.

The pipelines need TensorFlow and TensorFlow Datasets whatever the Keras
backend: under JAX or PyTorch, ``model.fit`` reads ``tf.data`` batches as
arrays.
"""

import dataclasses

import keras

from keras_precrop.errors import is_integer

try:
    import tensorflow as tf
    import tensorflow_datasets as tfds
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"keras_precrop.data (tf.data input pipelines from TensorFlow Datasets) needs TensorFlow "
        f"and tensorflow-datasets whatever the Keras backend ({_err}). Install them with e.g. "
        "`pip install keras-precrop[cpu]` (or [gpu], [tf]); profile, precrop, reconfigure, pai "
        "and train work without them."
    ) from _err


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a supported TFDS dataset.

    Attributes:
        name: TFDS name.
        num_classes: number of labels.
        image_size: side of the square model input.
        train_split: TFDS split used for training.
        eval_split: TFDS split used for the reported test accuracy.
        mean: per-channel mean of the [0, 1]-scaled training images.
        std: per-channel standard deviation of the same. (CIFAR-10's values
            are the Synaptic-Flow codebase's, which the seed paper builds on;
            they are within 2e-3 of the exact statistics.)
        shuffle_buffer: default shuffle buffer (in examples) for training.
        cache: whether the decoded dataset fits in memory and is cached.
    """

    name: str
    num_classes: int
    image_size: int
    train_split: str
    eval_split: str
    mean: tuple
    std: tuple
    shuffle_buffer: int
    cache: bool

    @property
    def input_shape(self):
        """``(height, width, 3)`` of the model input."""
        return (self.image_size, self.image_size, 3)


DATASETS = {
    "cifar10": DatasetInfo(
        name="cifar10",
        num_classes=10,
        image_size=32,
        train_split="train",
        eval_split="test",
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        shuffle_buffer=50_000,
        cache=True,
    ),
    "imagenet2012": DatasetInfo(
        name="imagenet2012",
        num_classes=1000,
        image_size=224,
        train_split="train",
        eval_split="validation",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        shuffle_buffer=10_000,
        cache=False,
    ),
}

_CIFAR_PAD = 4
# Eval resize: shorter side to image_size / 0.875 (256 for 224), then center crop.
_IMAGENET_CENTER_FRACTION = 0.875


def get_info(dataset):
    """Returns the ``DatasetInfo`` of a supported dataset name.

    Raises:
        ValueError: for an unsupported name (the message lists the valid ones).
    """
    if dataset not in DATASETS:
        raise ValueError(f"Unsupported dataset {dataset!r}; valid names are: {', '.join(sorted(DATASETS))}.")
    return DATASETS[dataset]


def model_rescales_inputs(model):
    """Tells whether a model scales raw [0, 255] pixels itself.

    ``keras.applications`` EfficientNets start with ``Rescaling`` (and
    ``Normalization``) layers and expect raw pixels; feeding them normalized
    images would normalize twice. Such models need ``normalize=False``.

    Args:
        model: a functional ``keras.Model``.

    Returns:
        True if the first layer after the input is a ``keras.layers.Rescaling``.
    """
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    return bool(layers) and isinstance(layers[0], keras.layers.Rescaling)


def _to_uint8_image(image):
    """Decodes encoded image bytes (ImageNet is loaded undecoded) to uint8 HxWx3."""
    if image.dtype == tf.string:
        image = tf.io.decode_image(image, channels=3, expand_animations=False)
    return image


def _normalize(image, info, normalize):
    """Casts to float32 and applies ``(x / 255 - mean) / std`` if ``normalize``."""
    image = tf.cast(image, tf.float32)
    if not normalize:
        return image
    mean = tf.constant(info.mean, tf.float32)
    std = tf.constant(info.std, tf.float32)
    return (image / 255.0 - mean) / std


def _cifar10_augment(image, seed):
    """Pad-4 zero padding, random 32x32 crop and random horizontal flip."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    padded = tf.pad(image, [[_CIFAR_PAD, _CIFAR_PAD], [_CIFAR_PAD, _CIFAR_PAD], [0, 0]])
    image = tf.image.stateless_random_crop(padded, tf.shape(image), seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)


def _imagenet_train_crop(image, size, seed):
    """Inception-style random resized crop to ``size`` plus a random flip."""
    box_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=box_seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3.0 / 4.0, 4.0 / 3.0),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.slice(image, begin, crop_size)
    image = tf.image.resize(image, (size, size), method="bilinear")
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)


def _imagenet_eval_crop(image, size):
    """Resizes the shorter side to ``size / 0.875`` and takes the central crop."""
    resize_to = round(size / _IMAGENET_CENTER_FRACTION)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = resize_to / tf.reduce_min(shape)
    new_shape = tf.cast(tf.round(shape * scale), tf.int32)
    image = tf.image.resize(image, new_shape, method="bilinear")
    top = (new_shape[0] - size) // 2
    left = (new_shape[1] - size) // 2
    return image[top : top + size, left : left + size, :]


def preprocess_fn(dataset, *, training, normalize=True):
    """Returns the per-example preprocessing function of a dataset.

    Args:
        dataset: ``"cifar10"`` or ``"imagenet2012"``.
        training: True for random augmentation, False for the deterministic
            evaluation transform.
        normalize: apply the dataset's mean/std normalization; False returns
            float32 pixels in [0, 255] (for models that rescale inputs
            themselves, see ``model_rescales_inputs``).

    Returns:
        ``fn(image, label, seed) -> (image, label)``: ``image`` is a uint8
        HxWx3 tensor (or encoded bytes), ``seed`` a shape-[2] int tensor used
        only when ``training``; the result is a float32 image of the model's
        input shape and an int32 label.
    """
    info = get_info(dataset)

    def fn(image, label, seed):
        image = _to_uint8_image(image)
        if info.name == "cifar10":
            image = _cifar10_augment(image, seed) if training else image
        elif training:
            image = _imagenet_train_crop(image, info.image_size, seed)
        else:
            image = _imagenet_eval_crop(image, info.image_size)
        image = tf.ensure_shape(_normalize(image, info, normalize), info.input_shape)
        return image, tf.cast(label, tf.int32)

    return fn


def make_pipeline(
    examples,
    dataset,
    batch_size,
    *,
    training,
    seed=None,
    normalize=True,
    shuffle_buffer=None,
    cache=None,
    drop_remainder=None,
):
    """Turns a dataset of ``{"image", "label"}`` dicts into preprocessed batches.

    Order: (cache) -> (shuffle) -> augment -> batch -> prefetch(AUTOTUNE).
    Caching happens before augmentation, so cached epochs still get fresh
    random crops and flips.

    Args:
        examples: ``tf.data.Dataset`` of dicts with ``"image"`` (uint8 HxWx3 or
            encoded bytes) and ``"label"`` (integer) entries.
        dataset: ``"cifar10"`` or ``"imagenet2012"``; picks the transform.
        batch_size: global batch size (a strategy splits it across replicas); an
            integer, a NumPy one too (``np.int64(128)``), not a bool.
        training: shuffle and augment (True) or evaluate (False).
        seed: int for reproducible shuffling and augmentation; None for
            nondeterministic.
        normalize: see ``preprocess_fn``.
        shuffle_buffer: examples in the shuffle buffer; None for the dataset's
            default (all of CIFAR-10; 10k for ImageNet). Ignored when not
            training.
        cache: cache the decoded examples in memory; None for the dataset's
            default (CIFAR-10 only).
        drop_remainder: drop the last partial batch; None drops it when
            training (static batch shapes, as TPUs need) and keeps it for
            evaluation (every test example counts).

    Returns:
        A ``tf.data.Dataset`` of ``(images, labels)`` batches.

    Raises:
        ValueError: for a non-positive ``batch_size`` or ``shuffle_buffer``.
    """
    info = get_info(dataset)
    if not is_integer(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    shuffle_buffer = info.shuffle_buffer if shuffle_buffer is None else shuffle_buffer
    if training and (not is_integer(shuffle_buffer) or shuffle_buffer < 1):
        raise ValueError(f"shuffle_buffer must be a positive int, got {shuffle_buffer!r}.")
    cache = info.cache if cache is None else cache
    drop_remainder = training if drop_remainder is None else drop_remainder

    ds = examples.map(
        lambda example: (example["image"], example["label"]), num_parallel_calls=tf.data.AUTOTUNE
    )
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    fn = preprocess_fn(dataset, training=training, normalize=normalize)
    ds = tf.data.Dataset.zip(ds, seeds).map(
        lambda pair, seed_pair: fn(pair[0], pair[1], seed_pair),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=seed is not None or not training,
    )
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def load(
    dataset,
    split,
    batch_size,
    *,
    data_dir=None,
    training=None,
    download=False,
    **pipeline_kwargs,
):
    """Loads a TFDS split and returns its batched input pipeline.

    Args:
        dataset: ``"cifar10"`` or ``"imagenet2012"``.
        split: TFDS split, e.g. ``"train"``, ``"test"``, ``"train[:10%]"``.
        batch_size: global batch size.
        data_dir: TFDS data directory (local path or ``gs://`` bucket); None for
            TFDS' default (``~/tensorflow_datasets``).
        training: augment and shuffle; None means "split starts with the
            dataset's train split name".
        download: let TFDS download and prepare missing data (ImageNet cannot
            be downloaded automatically; prepare it once by hand).
        **pipeline_kwargs: passed to ``make_pipeline`` (``seed``,
            ``normalize``, ``shuffle_buffer``, ``cache``, ``drop_remainder``).

    Returns:
        A ``tf.data.Dataset`` of ``(images, labels)`` batches with known
        cardinality.
    """
    info = get_info(dataset)
    if training is None:
        training = split.startswith(info.train_split)
    # ImageNet stays JPEG-encoded through the shuffle buffer (decoded images
    # would need gigabytes); preprocess_fn decodes it.
    decoders = None if info.cache else {"image": tfds.decode.SkipDecoding()}
    examples = tfds.load(
        dataset,
        split=split,
        data_dir=data_dir,
        download=download,
        shuffle_files=training,
        decoders=decoders,
        read_config=tfds.ReadConfig(shuffle_seed=pipeline_kwargs.get("seed")),
    )
    return make_pipeline(examples, dataset, batch_size, training=training, **pipeline_kwargs)
