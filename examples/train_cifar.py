"""Trains a CIFAR-10 zoo model, optionally compressed at initialization.

Examples:
  python examples/train_cifar.py --model resnet20 --method baseline \
      --data_dir ../shared/tfds --model_dir /tmp/resnet20
  python examples/train_cifar.py --model resnet20 --method precrop_params \
      --params 0.3 --model_dir /tmp/resnet20_precrop
  python examples/train_cifar.py --model vgg16 --method synflow --params 0.05 \
      --epochs 2 --steps_per_epoch 20 --model_dir /tmp/vgg16_synflow
  python examples/train_cifar.py --method baseline --save_model --model_dir /tmp/dense
  python examples/train_cifar.py --method precrop_flops --flops 0.27 \
      --init_model /tmp/dense/final_model.keras --keep_weights --distill \
      --epochs 3 --learning_rate 0.01 --model_dir /tmp/dense_pruned

Uses the seed paper's CIFAR-10 recipe (momentum SGD, lr 0.1 decayed linearly,
160 epochs, batch 128, weight decay 1e-4) unless flags override it. The last
example prunes the trained model keeping its channels' weights and fine-tunes
it 3 epochs at lr 0.01 (decayed linearly to 0), distilled from the original.
"""

from absl import app

import _common


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    _common.run("cifar10")


if __name__ == "__main__":
    _common.define_flags(default_model="resnet20")
    app.run(main)
