"""Model zoo: Keras 3 functional CNNs with readable, stable layer names.

``get(name, input_shape=None, num_classes=None, **kwargs)`` builds an
uncompiled, randomly initialized model returning logits; ``list()`` gives the
valid names. The builders are also public for non-default configurations:
``cifar_resnet(depth, width)``, ``vgg(plan)``, ``mobilenet_v2_cifar(alpha)``
and ``imagenet_resnet(blocks_per_stage)``.
"""

from keras_precrop.models.cifar_resnet import cifar_resnet
from keras_precrop.models.imagenet_resnet import imagenet_resnet
from keras_precrop.models.mobilenet_cifar import mobilenet_v2_cifar
from keras_precrop.models.registry import get, list_models
from keras_precrop.models.vgg import VGG16_PLAN, vgg

list = list_models  # noqa: A001 - the public name is keras_precrop.models.list()

__all__ = [
    "VGG16_PLAN",
    "cifar_resnet",
    "get",
    "imagenet_resnet",
    "list_models",
    "mobilenet_v2_cifar",
    "vgg",
]
