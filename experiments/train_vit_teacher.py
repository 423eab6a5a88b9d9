"""Trains the CIFAR-10 ViT teachers of issue 61, resumably, one seed per call.

The teacher is keras_hub's own ``ViTImageClassifier`` on a ``ViTBackbone``
sized to train here in about an hour and to cost about what ResNet-20 costs:
32x32 input, patch 4 (64 patches and a class token), 6 layers of 4 heads,
hidden width 128, MLP width 256 (811,146 parameters, about 58M MACs).
ViTs do not train from scratch with the seed paper's momentum-SGD recipe, so
this uses the usual small-ViT one: AdamW (lr 1e-3 at batch 128, weight decay
0.05), 2 warm-up epochs then cosine decay to 0, the CIFAR-10 crop and flip
augmentation of ``kp.data``.

``kp.train.fit`` does the rest: a killed run restarted with the same
arguments continues after its last finished epoch, ``history.csv`` keeps
each epoch's accuracy and ``results.json`` the final one. The finished
model is slimmed (no optimizer state) to ``final_model.keras``, small enough
to commit (3 MB).

Example (in the background, low priority so tests and timings come first)::

  setsid nohup nice -n 19 python experiments/train_vit_teacher.py --seed 0 \
      > vit_s0.log 2>&1 &
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

import keras

import keras_precrop as kp

ROOT = pathlib.Path(__file__).resolve().parent
CONFIG = {
    "image_shape": (32, 32, 3),
    "patch_size": 4,
    "num_layers": 6,
    "num_heads": 4,
    "hidden_dim": 128,
    "mlp_dim": 256,
    "dropout_rate": 0.0,
    "attention_dropout": 0.0,
}
RECIPE = {"batch_size": 128, "learning_rate": 1e-3, "weight_decay": 0.05, "warmup_epochs": 2}


def run_name(epochs, seed):
    """The run's directory name under ``experiments/runs``."""
    return f"vit_cifar-teacher-ep{epochs}-s{seed}"


def build(seed):
    """The teacher, freshly initialized from ``seed``: a keras_hub ViTImageClassifier (logits)."""
    import keras_hub  # an optional dependency of the package, needed by this script alone

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ViTBackbone(**CONFIG)
    return keras_hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=10, preprocessor=None, activation=None)


def compile_teacher(model, steps_per_epoch, epochs, warmup_epochs=RECIPE["warmup_epochs"]):
    """AdamW with a linear warm-up (of fewer epochs in a shorter run) and cosine decay to 0.

    ``model`` may be a ``keras.distillation.Distiller``: the loss is its student's."""
    warmup = min(warmup_epochs, epochs - 1) * steps_per_epoch
    rate = RECIPE["learning_rate"]
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else rate, decay_steps=epochs * steps_per_epoch - warmup,
        warmup_target=rate if warmup else None, warmup_steps=warmup)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=RECIPE["weight_decay"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])


def main(argv=None):
    """Trains (or resumes) one seed's teacher and writes its results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser, epochs=20)
    args = parser.parse_args(argv)
    model_dir = pathlib.Path(args.model_dir or ROOT / "runs" / run_name(args.epochs, args.seed))
    train, test = cifar10(args)
    model = build(args.seed)
    compile_teacher(model, args.steps_per_epoch or int(train.cardinality()), args.epochs)
    start = time.time()
    result = fit(model, train, test, model_dir, args)
    final = model_dir / "final_model.keras"
    result.model.save(final)
    sys.path.insert(0, str(ROOT))
    from run import slim_model  # the drivers' own slimming, as for the CNN teachers

    slim_model(final)
    record = {
        "model": "keras_hub.ViTImageClassifier", "config": CONFIG, "recipe": RECIPE,
        "epochs": args.epochs, "seed": args.seed, "test_accuracy": accuracy(result.model, test),
        "params": result.model.count_params(), "train_seconds_this_call": time.time() - start,
    }
    write_results(model_dir, "train_vit_teacher.py", record)


def add_run_arguments(parser, epochs):
    """The arguments every ViT experiment script takes: seed, epochs, data, smoke-test steps, run folder."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--data_dir", default=str(ROOT.parent.parent / "shared" / "tfds"))
    parser.add_argument("--steps_per_epoch", type=int, help="a smoke test's short epochs")
    parser.add_argument("--model_dir", help="default: experiments/runs/<run name>")


def cifar10(args):
    """CIFAR-10's ``(train, test)`` as the recipe reads them: augmented batches of 128 in the
    seed's order, and the test set in batches of 500."""
    train = kp.data.load("cifar10", "train", RECIPE["batch_size"], data_dir=args.data_dir,
                         seed=args.seed)
    return train, kp.data.load("cifar10", "test", 500, data_dir=args.data_dir)


def fit(model, train, test, model_dir, args, callbacks=()):
    """``kp.train.fit`` of a compiled model for ``args.epochs`` (resumable; a smoke test's short
    epochs evaluate on 2 batches)."""
    return kp.train.fit(model, train, test, model_dir=str(model_dir), epochs=args.epochs,
                        steps_per_epoch=args.steps_per_epoch, callbacks=callbacks,
                        eval_steps=args.steps_per_epoch and 2, tensorboard=False)


def accuracy(model, test):
    """Test accuracy (%) of a compiled model."""
    return 100 * model.evaluate(test, verbose=0, return_dict=True)["accuracy"]


def write_results(model_dir, script, record):
    """``record`` with how to rerun it (command, commit, backend) as ``model_dir/results.json``."""
    record = {
        **record,
        "command": " ".join(["python", f"experiments/{script}", *sys.argv[1:]]),
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                     text=True, cwd=ROOT).stdout.strip(),
        "backend": keras.backend.backend(), "keras": keras.__version__,
    }
    (model_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
