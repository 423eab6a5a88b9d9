"""Name -> builder table behind ``keras_precrop.models.get`` and ``list``."""

import functools

import keras

from keras_precrop.models import _layers
from keras_precrop.models.cifar_resnet import cifar_resnet
from keras_precrop.models.imagenet_resnet import imagenet_resnet
from keras_precrop.models.mobilenet_cifar import mobilenet_v2_cifar
from keras_precrop.models.vgg import vgg

_CIFAR = ((32, 32, 3), 10)
_IMAGENET = ((224, 224, 3), 1000)


def _keras_application(application, input_shape, num_classes, name, **kwargs):
    """Builds a ``keras.applications`` model with fresh random weights and logits.

    ``classifier_activation=None`` makes it return logits like every other zoo
    model; pass ``classifier_activation="softmax"`` to get Keras' default back.
    """
    input_shape = _layers.check_build_args(input_shape, num_classes)
    kwargs.setdefault("classifier_activation", None)
    return application(
        weights=None,
        include_top=True,
        input_shape=input_shape,
        classes=num_classes,
        name=name,
        **kwargs,
    )


# name -> (builder(input_shape=, num_classes=, name=, **kwargs),
#          (default input_shape, default num_classes))
_MODELS = {
    **{
        f"resnet{depth}": (functools.partial(cifar_resnet, depth=depth), _CIFAR)
        for depth in (20, 32, 44, 56, 110)
    },
    "wide_resnet20": (functools.partial(cifar_resnet, depth=20, width=32), _CIFAR),
    "vgg16": (vgg, _CIFAR),
    "mobilenet_v2_cifar": (mobilenet_v2_cifar, _CIFAR),
    "resnet18": (functools.partial(imagenet_resnet, blocks_per_stage=(2, 2, 2, 2)), _IMAGENET),
    "resnet34": (functools.partial(imagenet_resnet, blocks_per_stage=(3, 4, 6, 3)), _IMAGENET),
    "mobilenet_v2": (
        functools.partial(_keras_application, keras.applications.MobileNetV2), _IMAGENET
    ),
    "efficientnet_b0": (
        functools.partial(_keras_application, keras.applications.EfficientNetB0), _IMAGENET
    ),
}


def list_models():
    """Returns the sorted names accepted by ``get``."""
    return sorted(_MODELS)


def get(name, input_shape=None, num_classes=None, **kwargs):
    """Builds a zoo model by name, uncompiled and freshly (randomly) initialized.

    CIFAR models default to ``input_shape=(32, 32, 3)`` and 10 classes, ImageNet
    models (``resnet18``, ``resnet34``, ``mobilenet_v2``, ``efficientnet_b0``)
    to ``(224, 224, 3)`` and 1000 classes. Every model returns logits and is
    named ``name`` unless ``kwargs`` sets another ``name``.

    Args:
        name: one of ``list_models()``.
        input_shape: ``(height, width, channels)``; ``None`` for the default.
        num_classes: number of logits; ``None`` for the default.
        **kwargs: passed to the builder (e.g. ``alpha`` for the MobileNets).

    Returns:
        An uncompiled ``keras.Model``.

    Raises:
        ValueError: for an unknown name (the message lists the valid ones) or
            invalid arguments.
    """
    if not isinstance(name, str) or name not in _MODELS:
        raise ValueError(f"Unknown model {name!r}; valid names are: {', '.join(list_models())}.")
    builder, (default_shape, default_classes) = _MODELS[name]
    kwargs.setdefault("name", name)
    return builder(
        input_shape=default_shape if input_shape is None else input_shape,
        num_classes=default_classes if num_classes is None else num_classes,
        **kwargs,
    )
