"""``keras-precrop prune-trained``'s data and training, apart from its flags and its plan.

What ``--data`` holds (``cifar10`` through TensorFlow Datasets, or a .npz of
arrays) and how it is checked against the model, the examples a ranking that
needs data takes, the warning for data the original scores at chance on, and
the training recipe (``kp.fine_tune`` with ``kp.GradualPruning``, then the
smaller model). Like :mod:`keras_precrop.cli`, it imports nothing heavy at
module level, so ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import sys

import keras_precrop as kp
from keras_precrop import progress as _progress

TAYLOR_EXAMPLES = 512


# The training recipe of prune-trained: the examples' for a trained model (examples/_common.py,
# kp.train.RECIPES["cifar10"]: SGD momentum 0.9, batch 128, coupled L2 1e-4, the rate rewound to
# 0.1 and decayed linearly; masks updated every 20 steps, --gradual_frequency's default);
# spelled here so that --help imports nothing (tests/test_cli_prune_trained.py checks them).
RECIPE = {"learning_rate": 0.1, "batch_size": 128, "weight_decay": 1e-4, "frequency": 20}


def check_data_spec(args):
    """Refuse a ``--data`` that is neither ``cifar10`` nor an existing .npz file."""
    if args.data == "cifar10":
        return
    if args.data_dir is not None:
        raise ValueError(f"--data_dir {args.data_dir} has no effect with --data {args.data}: "
                         "only --data cifar10 reads a TFDS directory.")
    if not args.data.endswith(".npz"):
        raise ValueError(f"--data {args.data}: give cifar10 or a .npz file with arrays x_train, "
                         "y_train (and x_test, y_test), e.g. np.savez('data.npz', x_train=x, ...).")
    if not os.path.exists(args.data):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), args.data)


def check_split(args):
    """Refuse a ``--split`` that is not a part of cifar10's train split."""
    if args.split is None:
        return
    if args.data != "cifar10":
        raise ValueError(f"--split {args.split} has no effect with --data {args.data}: only --data "
                         "cifar10 reads a TFDS split; put the examples to train on in the .npz.")
    if not args.split.startswith("train"):
        raise ValueError(f"--split {args.split}: train on a part of CIFAR-10's train split, e.g. "
                         "--split train[:10%]; the test split is what the test accuracy is read on.")


def prune_data(args, model):
    """``(train, test, steps per epoch)`` of ``--data``; ``test`` is None for a .npz without one.

    ``train`` and ``test`` are what ``kp.fine_tune`` takes: ``(x, y)`` arrays,
    or batched ``tf.data`` pipelines for ``cifar10`` (normalized unless the
    model rescales its inputs itself, as the examples train it; ``train`` is
    ``--split``, a slice of the train split, where given).
    """
    if args.data == "cifar10":
        data = kp.data
        info, normalize = data.get_info("cifar10"), not data.model_rescales_inputs(model)
        train, test = (data.load("cifar10", split, args.batch_size, data_dir=args.data_dir,
                                 download=True, normalize=normalize)
                       for split in (args.split or info.train_split, info.eval_split))
        if not len(train):  # the training pipeline drops a last partial batch
            raise ValueError(f"--split {args.split} holds fewer examples than one batch (--batch_size "
                             f"{args.batch_size}); take a larger slice, e.g. --split train[:10%].")
        return train, test, len(train)
    arrays = _npz_arrays(args.data)
    train = arrays["x_train"], arrays["y_train"]
    test = (arrays["x_test"], arrays["y_test"]) if "x_test" in arrays else None
    return train, test, math.ceil(len(train[0]) / args.batch_size)


def _npz_arrays(path):
    """The arrays of ``--data``'s .npz file: x_train and y_train, and x_test with y_test if there."""
    import numpy as np  # noqa: PLC0415  (after the arguments are parsed: see the module docstring)

    try:
        loaded = np.load(path)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # an .npy's one array, as np.save writes
            raise ValueError(f"it holds one array of shape {loaded.shape}, as np.save writes")
        with loaded as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, AttributeError) as err:  # not an archive: an .npy's array, a pickle
        raise ValueError(f"--data {path} is not a .npz archive of named arrays ({err}): save "
                         "x_train and y_train (and x_test, y_test for a test accuracy) with "
                         f"np.savez({path!r}, x_train=x, y_train=y), the images preprocessed as "
                         "the model takes them (scaled and normalized as it was trained).") from None
    for needed in (("x_train", "y_train"), ("x_test", "y_test")):
        found = [name for name in needed if name in arrays]
        if len(found) == 1 or (not found and needed[0] == "x_train"):
            missing = next(name for name in needed if name not in arrays)
            raise ValueError(f"--data {path} has no array {missing} (it has: "
                             f"{', '.join(sorted(arrays)) or 'none'}); give x_train and y_train, "
                             "and x_test with y_test for a test accuracy.")
    return arrays


def first_batches(train, batch_size):
    """The first training examples, in batches: what a ranking that needs data (``--importance
    taylor``) takes gradients on, and what the original model is scored on before training
    (:func:`warn_at_chance`)."""
    if isinstance(train, tuple):
        from keras_precrop.training._user_data import array_batches  # noqa: PLC0415  (as keras above)

        return array_batches(train, batch_size, limit=TAYLOR_EXAMPLES)
    return train.take(math.ceil(TAYLOR_EXAMPLES / batch_size))


def warn_at_chance(args, model, batches):
    """Warn (stderr) when the original model scores at chance on ``--data``'s first examples.

    A trained classifier at chance on its own kind of data is fed data
    prepared otherwise than in its training (raw 0-255 pixels to a model
    trained on normalized ones): the pruned model would train on it for
    nothing, and both accuracies would mean nothing. Said before training
    starts, so the run can be stopped.
    """
    from keras_precrop.training.finetune import accuracy  # noqa: PLC0415  (as keras above)

    classes = model.outputs[0].shape[-1]
    if not classes or classes < 2:
        return
    score, chance = accuracy(model, batches), 1 / classes
    if score > min(1.5 * chance, chance + 0.1):
        return
    data = ("A .npz must hold x_train (and x_test) as the model's input, already preprocessed as "
            "for its training (scaled, normalized), and y_train (and y_test) as integer class labels"
            if args.data.endswith(".npz") else
            f"--data {args.data} gives images normalized per channel ((x / 255 - mean) / std), or "
            "0-255 pixels to a model that starts with a Rescaling layer; give a model trained "
            "otherwise its data as a .npz of preprocessed arrays")
    print(f"keras-precrop: warning: the original model scores {score:.4f} on the first examples of "
          f"--data {args.data}, chance level for its {classes} classes ({chance:.4f}): the data "
          f"likely lacks the preprocessing the model was trained with. {data} (docs/cli.md).",
          file=sys.stderr, flush=True)


def check_prune_data(args, model, train, test):
    """``--data``'s splits checked against the model (as ``kp.fine_tune`` checks them), before a
    plan is solved: a latency budget would be timed first, for minutes."""
    from keras_precrop.training._user_data import check_data  # noqa: PLC0415  (NumPy: not for --help)

    arrays = isinstance(train, tuple)
    with _data_errors(args, arrays):
        check_data(model, train, "train_data", batch_size=args.batch_size if arrays else None)
        if test is not None:
            check_data(model, test, "validation_data", batch_size=args.batch_size if arrays else None)


@contextlib.contextmanager
def _data_errors(args, arrays):
    """Data that does not fit the model, named as ``--data`` and its arrays or splits."""
    from keras_precrop.errors import DataError  # noqa: PLC0415  (NumPy: not for --help)

    try:
        yield
    except DataError as err:
        splits = {"train_data": "x_train, y_train" if arrays else "its train split",
                  "validation_data": "x_test, y_test" if arrays else "its test split"}
        raise ValueError(f"--data {args.data}: " + err.format(
            lambda name, value: splits.get(name, name), front="cli")) from None


def train_pruned(args, student, teacher, train, test, pruning, steps):
    """``kp.fine_tune`` with the recipe, returning the pruned model; data that does not fit names --data.

    The student trains masked by ``pruning`` until the epoch in which its masks
    reach the plan, then the finalized smaller model trains the other epochs with
    the optimizer's state carried over (``optimizer_from``): the same training,
    at the smaller model's cost. One schedule spans both. Without ``pruning``
    (``--refit``: cut before training) the student trains every epoch as it is.
    """
    import keras  # noqa: PLC0415  (after the arguments are parsed: see the module docstring)

    if pruning is None and not args.epochs:  # cut already (--refit --epochs 0): as it is
        return student
    arrays = isinstance(train, tuple)
    recipe = {"teacher": teacher, "batch_size": args.batch_size if arrays else None,
              "learning_rate": keras.optimizers.schedules.PolynomialDecay(
                  args.learning_rate, args.epochs * steps, 0.0),
              "validation_data": test, "weight_decay": RECIPE["weight_decay"],
              "verbose": _progress.fit_verbose()}  # no progress bar's control codes in a log
    with _data_errors(args, arrays):
        if pruning is None:  # cut already (--refit): the pruned model trains every epoch
            kp.fine_tune(student, train, epochs=args.epochs, **recipe)
            return student
        cut = min(args.epochs, max(1, math.ceil(pruning.end_step / steps)))
        kp.fine_tune(student, train, epochs=cut, callbacks=[pruning], **recipe)
        small = pruning.finalize()
        if cut < args.epochs:
            kp.fine_tune(small, train, epochs=args.epochs, initial_epoch=cut, optimizer_from=pruning,
                         **recipe)
    return small


def print_pruned(args, original, small):
    """The line that says where the pruned model went, and its params and MACs against the original's.

    A model of open input size (``(None, None, 3)``) has no MAC count: its
    parameters are given alone, and why.
    """
    before, after = original.count_params(), small.count_params()
    line = f"Model written to {args.out}: {after:,} params ({after / before:.1%} of {before:,})"
    try:
        macs_before, macs_after = kp.profile(original).total_macs, kp.profile(small).total_macs
    except kp.UnsupportedModelError:  # an open input size: MACs depend on it
        print(f"{line}; MACs depend on the input size, which the model leaves open")
        return
    print(f"{line}, {macs_after:,} MACs ({macs_after / macs_before:.1%} of {macs_before:,})")
