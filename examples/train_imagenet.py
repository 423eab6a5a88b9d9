"""Trains an ImageNet zoo model, optionally compressed at initialization.

Examples:
  python examples/train_imagenet.py --model efficientnet_b0 --method preconfig \
      --params 0.8 --flops 1.0 --data_dir gs://BUCKET/tensorflow_datasets \
      --model_dir gs://BUCKET/efficientnet_b0_preconfig --strategy tpu
  python examples/train_imagenet.py --model resnet18 --method precrop_flops \
      --flops 0.5 --data_dir ~/tensorflow_datasets --model_dir /tmp/resnet18

Needs ``imagenet2012`` prepared in ``--data_dir`` (TFDS cannot download it).
The recipe follows the model family, as in the seed paper's table: MobileNet
(lr 0.025 x0.98 per epoch, 180 epochs, batch 256, wd 4e-5), ResNet (lr 0.2
x0.1 at epochs 30 and 60, 90 epochs, batch 512, wd 1e-4), EfficientNet
(lr 0.035 x0.99 per epoch, 150 epochs, batch 256, wd 4e-5).
"""

from absl import app

import _common


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    _common.run("imagenet2012")


if __name__ == "__main__":
    _common.define_flags(default_model="resnet18")
    app.run(main)
