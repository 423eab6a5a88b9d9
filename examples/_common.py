"""Shared driver of ``train_cifar.py`` and ``train_imagenet.py``.

One run: pick a strategy, build the zoo model, compress it with ``--method``
(planning and mask scoring happen outside the strategy scope, on a reference
model), rebuild it inside the scope, print the params/MACs table of the model
actually trained, train with the seed paper's recipe, and write
``results.json`` into ``--model_dir``. A killed run restarted with the same
flags resumes after its last finished epoch.

A trained model (``--init_model``) can be the reference instead: pruned with
``--keep_weights`` (its most important channels keep their weights,
``--importance``) and fine-tuned with the same loop, for ``--epochs`` at
``--learning_rate``, alone or distilled from it (``--distill``). Its test
accuracy is taken before training as well (``pruned_accuracy``), and after
every epoch as for any run.

The flags are the same on every Keras backend; pick one with the
``KERAS_BACKEND`` environment variable (``tensorflow``, ``jax`` or
``torch``). The input pipelines are tf.data (TensorFlow Datasets) on all of
them; ``--strategy`` is a ``tf.distribute`` strategy on TensorFlow and Keras'
``DataParallel`` distribution on JAX (see ``keras_precrop.train.get_strategy``).
"""

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_precrop as kp  # noqa: E402
from keras_precrop import data, pai, train  # noqa: E402
from keras_precrop.training import finetune  # noqa: E402
from keras_precrop.training.finetune import distiller  # noqa: E402

STRUCTURED = ("precrop_params", "precrop_flops", "preconfig", "precrop_plan")
UNSTRUCTURED = ("synflow", "snip", "grasp", "magnitude", "random")
METHODS = ("baseline", *UNSTRUCTURED, *STRUCTURED)
# The backup folder of a model rebuilt smaller mid-run (--gradual_rebuild), beside the masked model's.
_REBUILT_BACKUP = "backup_rebuilt"
# Training examples whose gradients rank channels for --importance=taylor (whole batches, rounded up).
TAYLOR_EXAMPLES = 512

FLAGS = flags.FLAGS


def define_flags(default_model):
    """Defines the flags both scripts share; ``default_model`` is ``--model``'s default.

    The flags come in groups: the model and its compression, the training run,
    the trained model to start from, and its gradual pruning.
    """
    flags.DEFINE_string("model", default_model, f"Zoo model, one of: {', '.join(kp.models.list())}.")
    flags.DEFINE_enum("method", "baseline", METHODS, "Compression applied at initialization.")
    _define_compression_flags()
    _define_training_flags()
    _define_transfer_flags()
    _define_gradual_flags()


def _define_compression_flags():
    """Defines the budgets and options of ``--method``'s compression at initialization."""
    flags.DEFINE_float(
        "params",
        None,
        "Parameter budget as a ratio of the original model (PreCrop/PreConfig); "
        "the weight density for synflow, snip, grasp and random.",
    )
    flags.DEFINE_float(
        "flops", None, "FLOP budget as a ratio of the original model (precrop_*, preconfig, and "
        "--method=random with --densities=synexp)."
    )
    flags.DEFINE_string(
        "plan_file", None, "--method=precrop_plan: train the model this plan JSON describes "
        "(e.g. a latency plan timed on the machine it was made for)."
    )
    flags.DEFINE_enum(
        "mode",
        None,
        ["auto", "exact", "layerwise", "paper", "uniform"],
        "Width translation of precrop_*/preconfig; default: the library's (auto: layerwise for "
        "preconfig and under --flops, exact otherwise).",
    )
    flags.DEFINE_float(
        "balance",
        None,
        "Exact mode only: the most by which the width ratios of adjacent widths (a kernel's input and "
        "output, a residual view and its stream) may differ, e.g. 2; default: no bound.",
    )
    flags.DEFINE_integer("round_to", None, "Channel multiple of precrop_*/preconfig widths; default 1.")
    flags.DEFINE_enum(
        "residual", None, ["prefix", "tie"], "Residual semantics of precrop_*/preconfig; default prefix."
    )
    flags.DEFINE_enum(
        "granularity",
        "weight",
        ["weight", "filter", "channel"],
        "Unit of --method=random: single weights, k x k filters or whole channels.",
    )
    flags.DEFINE_enum(
        "densities",
        None,
        ["synexp", "synflow"],
        "Per-layer densities of --method=random at --params: SynExp's optimum (the paper's "
        "density program) or the densities of SynFlow's masks; default: --params in every layer.",
    )


def _define_training_flags():
    """Defines the training run: recipe overrides, data, output, distribution and logging."""
    flags.DEFINE_integer("epochs", None, "Training epochs; default: the paper's recipe.")
    flags.DEFINE_integer(
        "batch_size", None, "Global batch size; default: the paper's recipe (lr scales linearly)."
    )
    flags.DEFINE_float(
        "learning_rate",
        None,
        "Initial learning rate at the recipe's batch size (scaled linearly with --batch_size and "
        "decayed as the recipe says, to 0 over --epochs on CIFAR-10); default: the recipe's (0.1 on "
        "CIFAR-10). To fine-tune an --init_model, e.g. 0.01: the rate its last epoch trained at.",
    )
    flags.DEFINE_string("data_dir", None, "TFDS data directory (local or gs://); default: TFDS' own.")
    flags.DEFINE_string(
        "model_dir", None, "Output directory: checkpoints, logs, results.json.", required=True
    )
    flags.DEFINE_enum(
        "strategy",
        "auto",
        train.STRATEGIES,
        "Distribution: a tf.distribute strategy on TensorFlow; keras.distribution.DataParallel "
        "over the devices on JAX (auto, default, mirrored, tpu); one device on PyTorch (auto, default).",
    )
    flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu/auto; default: Colab/TPU VM.")
    flags.DEFINE_integer("seed", 0, "Seed of the initialization, masks and input pipeline.")
    flags.DEFINE_integer(
        "steps_per_epoch", None, "Batches per epoch, for short runs; default: the whole train split."
    )
    flags.DEFINE_integer(
        "eval_steps", None, "Evaluation batches, for short runs; default: the whole test split."
    )
    flags.DEFINE_integer(
        "steps_per_execution", 1, "Training steps per compiled call (tf.function, jax.jit; e.g. 64 on TPUs)."
    )
    flags.DEFINE_bool(
        "save_model", False, "Also keep the trained model as final_model.keras in --model_dir."
    )
    flags.DEFINE_bool(
        "export_init",
        False,
        "Build and compress the model as the other flags say, write it untrained to "
        "--model_dir/init_model.keras with init.json (everything results.json records before "
        "training), and exit: to train it elsewhere, e.g. on another backend without TensorFlow.",
    )
    flags.DEFINE_integer(
        "verbose",
        1,
        "0: silent training; 1: progress within epochs (a progress bar on a terminal, a plain "
        "line every 30 s in a log file); 2: one line per epoch. Also SynFlow's pruning rounds.",
        lower_bound=0,
        upper_bound=2,
    )


def _define_transfer_flags():
    """Defines the trained model to start from (``--init_model``), how it is pruned and taught."""
    flags.DEFINE_string(
        "init_model",
        None,
        "A trained model (.keras, e.g. a run's final_model.keras) to start from instead of a fresh "
        "--model; its architecture must be --model's. The structured methods prune it with "
        "--keep_weights; the masked methods score its trained weights; baseline trains it on.",
    )
    flags.DEFINE_bool(
        "keep_weights",
        False,
        "Structured methods on an --init_model: keep each width's most important channels with "
        "their trained weights (weights='keep'), to fine-tune rather than train from scratch.",
    )
    flags.DEFINE_enum(
        "importance",
        None,
        list(kp.transfer.IMPORTANCE),
        f"--keep_weights: how channels are ranked; default l1. taylor: |activation x gradient| on "
        f"{TAYLOR_EXAMPLES} training examples (with --gradual_epochs, at every update); bn_scale: "
        "the BatchNormalization scales that write each channel; random (seeded by --seed): the "
        "control.",
    )
    flags.DEFINE_bool(
        "distill",
        False,
        "Train with the --init_model as the teacher (keras.distillation.Distiller: logits KL at "
        "temperature 4, weight 0.5 beside the labels' loss; kp.fine_tune's defaults).",
    )
    flags.DEFINE_float(
        "distill_alpha", 0.5,
        "--distill: the weight of the labels' loss; the teacher's (the softened logits' KL) weighs "
        "1 - this (kp.fine_tune's alpha).",
    )


def _define_gradual_flags():
    """Defines ``--gradual_epochs`` and the options of its ``kp.GradualPruning`` callback."""
    flags.DEFINE_float(
        "gradual_epochs",
        None,
        "--keep_weights on an --init_model, pruned gradually rather than at once: the whole model "
        "trains with kp.GradualPruning masking channels on a cubic schedule until the plan's widths "
        "after this many epochs (e.g. 1), then the masks stay and, after the last epoch, the model is "
        "rebuilt smaller (finalize); default: pruned in one shot before training.",
    )
    flags.DEFINE_integer(
        "gradual_frequency", 20, "--gradual_epochs: optimizer steps between two updates of the masks."
    )
    flags.DEFINE_enum(
        "gradual_schedule", "cubic", ["cubic", "linear", "final"],
        "--gradual_epochs: how the masks grow (kp.gradual.schedule_fraction); final: all at the end, "
        "after the doomed channels faded with --gradual_shrink.",
    )
    flags.DEFINE_float(
        "gradual_shrink", 0.0,
        "--gradual_epochs: the channels the plan leaves out (re-ranked at each update) are multiplied "
        "by 1 - this after every step until they are masked (group sparsity aimed at what will go); "
        "0: off.",
    )
    flags.DEFINE_bool(
        "gradual_rebuild",
        False,
        "--gradual_epochs (a whole number, below --epochs): once the masks reach the plan, rebuild the "
        "model smaller and train it on with the optimizer's state carried over "
        "(kp.GradualPruning.carry_optimizer): the same training at the smaller model's cost; default: "
        "the masked model trains to the last epoch.",
    )
    flags.DEFINE_bool(
        "regrow",
        False,
        "--gradual_epochs: zero the masked weights at the updates only, so a masked channel may train "
        "back in between (soft filter pruning); default: after every step.",
    )


def _check_flags():
    """Raises ``app.UsageError`` (a one-line message) for inconsistent flags."""
    method = FLAGS.method
    for name in ("params", "flops"):
        value = getattr(FLAGS, name)
        if value is not None and not value > 0:
            raise app.UsageError(f"--{name} must be a positive ratio, got {value}.")
    for name in ("epochs", "batch_size", "steps_per_epoch", "eval_steps", "steps_per_execution"):
        value = getattr(FLAGS, name)
        if value is not None and value < 1:
            raise app.UsageError(f"--{name} must be a positive integer, got {value}.")
    if method in UNSTRUCTURED + ("precrop_params",) and FLAGS.params is None:
        raise app.UsageError(f"--method={method} needs --params.")
    if method in UNSTRUCTURED and FLAGS.params > 1:
        raise app.UsageError(
            f"--params is the weight density for --method={method}; it must be <= 1, got {FLAGS.params}."
        )
    if method in UNSTRUCTURED and FLAGS.flops is not None and FLAGS.densities != "synexp":
        raise app.UsageError(
            f"--method={method} keeps --params of the weights whatever their FLOPs; drop --flops "
            "(only --method=random with --densities=synexp takes it, for SynExp's densities under both).")
    if method == "precrop_flops" and FLAGS.flops is None:
        raise app.UsageError("--method=precrop_flops needs --flops.")
    if method == "preconfig" and FLAGS.params is None and FLAGS.flops is None:
        raise app.UsageError("--method=preconfig needs --params and/or --flops.")
    if (method == "precrop_plan") != (FLAGS.plan_file is not None):
        raise app.UsageError("--method=precrop_plan and --plan_file go together.")
    if method == "precrop_plan" and (FLAGS.params is not None or FLAGS.flops is not None
                                     or _plan_options()):
        raise app.UsageError("--plan_file fixes the widths; drop the budget and plan flags.")
    if method == "baseline" and (FLAGS.params is not None or FLAGS.flops is not None):
        raise app.UsageError("--method=baseline trains the full model; drop --params/--flops.")
    structural = [f"--{name}" for name in _plan_options()]
    if structural and method not in STRUCTURED:
        raise app.UsageError(
            f"{', '.join(structural)} apply to {'/'.join(STRUCTURED)}, not --method={method}.")
    if FLAGS.balance is not None and FLAGS.mode not in (None, "auto", "exact"):
        raise app.UsageError(f"--balance needs --mode=exact (or no --mode); got --mode={FLAGS.mode}.")
    if method != "random" and (FLAGS.densities is not None or FLAGS.granularity != "weight"):
        raise app.UsageError(
            f"--densities and --granularity apply to --method=random, not --method={method}.")
    _check_transfer_flags()


def _check_transfer_flags():
    """Raises ``app.UsageError`` for inconsistent --init_model, --keep_weights, --importance, --distill."""
    method = FLAGS.method
    if FLAGS.learning_rate is not None and not FLAGS.learning_rate > 0:
        raise app.UsageError(f"--learning_rate must be positive, got {FLAGS.learning_rate}.")
    if FLAGS.init_model is None:
        for name in ("keep_weights", "distill"):
            if getattr(FLAGS, name):
                raise app.UsageError(f"--{name} needs --init_model: the trained model whose weights "
                                     f"{'it keeps' if name == 'keep_weights' else 'teach'}.")
    elif not tf.io.gfile.exists(FLAGS.init_model):
        raise app.UsageError(f"--init_model {FLAGS.init_model}: no such file.")
    if FLAGS.keep_weights and method not in STRUCTURED:
        raise app.UsageError(f"--keep_weights applies to {'/'.join(STRUCTURED)}, not --method={method}; "
                             "the other methods keep the --init_model's weights anyway.")
    if FLAGS.init_model and method in STRUCTURED and not FLAGS.keep_weights:
        raise app.UsageError(f"--method={method} on --init_model needs --keep_weights: without it the "
                             "pruned model starts from fresh weights and the trained ones go unused.")
    if FLAGS.importance is not None and not FLAGS.keep_weights:
        raise app.UsageError(f"--importance={FLAGS.importance} ranks the channels that --keep_weights "
                             "keeps; add --keep_weights.")
    if FLAGS.gradual_epochs is not None and not (FLAGS.keep_weights and FLAGS.method in STRUCTURED):
        raise app.UsageError("--gradual_epochs prunes a trained model gradually: it needs a structured "
                             "--method with --init_model and --keep_weights.")
    if FLAGS.gradual_epochs is not None and not 0 <= FLAGS.gradual_epochs <= (FLAGS.epochs or 1e9):
        raise app.UsageError(f"--gradual_epochs must be in [0, --epochs], got {FLAGS.gradual_epochs}.")
    if FLAGS.gradual_epochs is not None and FLAGS.export_init:
        raise app.UsageError("--gradual_epochs prunes while training; --export_init trains nothing.")
    changed = [f"--{name}" for name in ("gradual_schedule", "gradual_shrink", "regrow", "gradual_rebuild")
               if FLAGS[name].value != FLAGS[name].default]
    if changed and FLAGS.gradual_epochs is None:
        raise app.UsageError(f"{', '.join(changed)} shape(s) gradual pruning; add --gradual_epochs.")
    cut = FLAGS.gradual_epochs
    if FLAGS.gradual_rebuild and cut is not None and not (
            cut == int(cut) >= 1 and cut < (FLAGS.epochs or math.inf)):
        raise app.UsageError(f"--gradual_rebuild rebuilds the model after --gradual_epochs={cut:g}: "
                             "give a whole number of epochs, at least 1 and below --epochs.")
    if not 0 <= FLAGS.gradual_shrink < 1:
        raise app.UsageError(f"--gradual_shrink must be in [0, 1), got {FLAGS.gradual_shrink}.")
    if FLAGS.distill_alpha != 0.5 and not FLAGS.distill:
        raise app.UsageError("--distill_alpha weighs the labels' loss against the teacher's; add --distill.")
    if not 0 <= FLAGS.distill_alpha <= 1:
        raise app.UsageError(f"--distill_alpha must be in [0, 1], got {FLAGS.distill_alpha}.")
    if FLAGS.distill and FLAGS.export_init:
        raise app.UsageError("--distill trains with the --init_model as teacher; --export_init trains "
                             "nothing (drop one).")


_PLAN_FLAGS = ("mode", "balance", "round_to", "residual")


def _plan_options():
    """The structural flags that were given, as ``precrop``/``reconfigure`` keywords."""
    return {name: getattr(FLAGS, name) for name in _PLAN_FLAGS if getattr(FLAGS, name) is not None}


def _plan(reference):
    """Plans PreCrop/PreConfig widths; unset flags keep the library's defaults.

    ``precrop_params`` and ``precrop_flops`` differ only in the budget they
    require; given both ``--params`` and ``--flops``, either meets both.
    """
    options = _plan_options()
    if FLAGS.method == "precrop_plan":
        return kp.Plan.from_json(FLAGS.plan_file)
    if FLAGS.method in ("precrop_params", "precrop_flops"):
        compressed = kp.precrop(reference, params=FLAGS.params, flops=FLAGS.flops, **options)
    else:
        compressed = kp.reconfigure(reference, params=FLAGS.params, flops=FLAGS.flops, **options)
    return compressed.precrop_plan


def _random_densities(reference):
    """Per-weight densities for ``--method=random``: a number, or ``{kernel path: density}``.

    ``synexp`` takes the solved layer densities of the paper's density program
    (``plan(mode="paper")`` at ``--params`` and ``--flops``, if given: the
    paper's figure 5 sweeps a FLOPs budget at one parameter count);
    ``synflow`` those of SynFlow's masks at ``--params``, so granularity is the
    only difference to SynFlow.
    """
    if FLAGS.densities is None:
        return FLAGS.params
    if FLAGS.densities == "synflow":
        return pai.layer_densities(pai.synflow(reference, FLAGS.params, verbose=0))
    solved = kp.plan(reference, params=FLAGS.params, flops=FLAGS.flops, mode="paper").solver[
        "layer_densities_solved"]
    return {f"{name}/kernel": density for name, density in solved.items()}


def _masks(reference, train_ds, num_classes, batch_size):
    """Scores the reference model's initial weights and returns its masks.

    SNIP and GraSP see ``10 * num_classes`` training examples (rounded up to
    whole batches), the Synaptic-Flow codebase's default the paper uses.
    """
    density = FLAGS.params
    num_batches = math.ceil(10 * num_classes / batch_size)
    if FLAGS.method == "synflow":
        return pai.synflow(reference, density, verbose=FLAGS.verbose)
    if FLAGS.method == "snip":
        return pai.snip(reference, train_ds, density, num_batches=num_batches)
    if FLAGS.method == "grasp":
        return pai.grasp(reference, train_ds, density, num_batches=num_batches)
    if FLAGS.method == "magnitude":
        return pai.magnitude(reference, density)
    if FLAGS.densities is None and FLAGS.granularity == "weight":
        return pai.random(reference, density, seed=FLAGS.seed)
    return pai.random_masks(
        reference, _random_densities(reference), granularity=FLAGS.granularity, seed=FLAGS.seed
    )


def _copy_of(reference):
    """A clone of ``reference`` with its initial weights (and layer names, which masks use)."""
    model = keras.models.clone_model(reference)
    model.set_weights(reference.get_weights())
    return model


def _keep_options(train_ds, batch_size):
    """``apply_plan``'s weight options: ``{}`` (fresh weights), or those of ``--keep_weights``."""
    if not FLAGS.keep_weights:
        return {}
    importance = FLAGS.importance or "l1"
    drawn = _needs(importance) == "seed"
    seed = FLAGS.seed if drawn else None  # nothing else of a kept model is drawn
    return dict(weights="keep", importance=importance, data=_taylor_data(train_ds, batch_size),
                seed=seed)


def _needs(importance):
    """What the ranking ``importance`` needs (``kp.transfer.criteria``'s table): weights, data or a seed."""
    return kp.transfer.criteria.criterion(importance).needs


def _taylor_data(train_ds, batch_size):
    """The training batches Taylor importance takes its gradients on; ``None`` for other rankings."""
    if _needs(FLAGS.importance or "l1") != "data":
        return None
    return train_ds.take(math.ceil(TAYLOR_EXAMPLES / batch_size))


def _student_builder(reference, train_ds, num_classes, batch_size):
    """Returns ``(build_model, masks)`` of the model to train; ``build_model`` runs inside the scope."""
    if FLAGS.method in STRUCTURED and FLAGS.gradual_epochs is not None:  # pruned while it trains
        return (lambda: _copy_of(reference)), None
    if FLAGS.method in STRUCTURED:
        plan, keep = _plan(reference), _keep_options(train_ds, batch_size)
        return (lambda: kp.apply_plan(reference, plan, **keep)), None
    if FLAGS.method in UNSTRUCTURED:
        masks = _masks(reference, train_ds, num_classes, batch_size)
        return (lambda: pai.apply_masks(_copy_of(reference), masks)), masks
    return (lambda: _copy_of(reference)), None


def _builder(reference, train_ds, num_classes, batch_size):
    """Returns ``(build_model, masks)``; ``build_model`` runs inside the strategy scope.

    With ``--distill`` it builds a ``Distiller`` (``kp.fine_tune``'s) around the
    model to train, with a copy of the reference (the ``--init_model``) as teacher.
    """
    build, masks = _student_builder(reference, train_ds, num_classes, batch_size)
    return (lambda: _trained(build(), reference)), masks


def _trained(student, reference):
    """What ``fit`` trains: ``student``, or with ``--distill`` a ``Distiller`` of it and a copy of
    the reference (the ``--init_model``) as teacher."""
    if FLAGS.distill:
        return distiller(student, _copy_of(reference), alpha=FLAGS.distill_alpha)
    return student


def _student(model):
    """The model being trained: ``model`` itself, or the student of a ``Distiller``."""
    return model.student if isinstance(model, keras.distillation.Distiller) else model


def _init_model(zoo):
    """The ``--init_model``, loaded, once its layers and weight shapes are ``zoo``'s (``--model``'s)."""
    try:
        model = keras.models.load_model(FLAGS.init_model, compile=False)
    except (ValueError, OSError) as err:
        raise app.UsageError(f"--init_model {FLAGS.init_model} is not a Keras model: {err}") from None

    def layout(m):
        return [(type(layer).__name__, [tuple(w.shape) for w in layer.weights]) for layer in m.layers]

    ours, theirs = layout(zoo), layout(model)
    differ = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if differ is None and len(ours) == len(theirs) and zoo.input_shape == model.input_shape:
        return model
    if differ is None:
        why = (f"it has {len(theirs)} layers and input shape {model.input_shape}, "
               f"--model {FLAGS.model} {len(ours)} and {zoo.input_shape}")
    else:
        why = (f"its layer {differ} ({model.layers[differ].name}) is a {theirs[differ][0]} with weights "
               f"{theirs[differ][1]}, --model {FLAGS.model}'s a {ours[differ][0]} with {ours[differ][1]}")
    raise app.UsageError(f"--init_model {FLAGS.init_model} is not a {FLAGS.model} of this dataset: "
                         f"{why}. Give the --model it was trained as.")


def _gradual_pruning(reference, train_ds, batch_size, steps):
    """The ``kp.GradualPruning`` callback of ``--gradual_epochs`` (``None`` without it)."""
    if FLAGS.gradual_epochs is None:
        return None
    importance = FLAGS.importance or "l1"
    if importance not in kp.gradual.IMPORTANCE:
        raise app.UsageError(f"--importance={importance} cannot rank channels during training; "
                             f"--gradual_epochs takes {'/'.join(kp.gradual.IMPORTANCE)}.")
    return kp.GradualPruning(_plan(reference), end_step=round(FLAGS.gradual_epochs * steps),
                             frequency=FLAGS.gradual_frequency, importance=importance,
                             data=_taylor_data(train_ds, batch_size), regrow=FLAGS.regrow,
                             schedule=FLAGS.gradual_schedule, shrink=FLAGS.gradual_shrink,
                             verbose=min(FLAGS.verbose, 1))


def _finalized(small, result, eval_ds):
    """``small``, the model rebuilt from the masks, once it scores what the masked model scored.

    The masked model computes what the rebuilt one does, so the rebuilt model's
    test accuracy is the last epoch's (checked here, to 0.2 pp: summation order).
    Read by calls, not ``evaluate``: ``small`` is not compiled (it may train on in a ``Distiller``).
    """
    accuracy = finetune.accuracy(small, eval_ds if FLAGS.eval_steps is None
                                 else eval_ds.take(FLAGS.eval_steps))
    print(f"Rebuilt {small.count_params():,} params from the masks: test accuracy {accuracy:.4f} "
          f"(the masked model's last epoch: {result.final_accuracy:.4f})")
    if abs(accuracy - result.final_accuracy) > 0.002:
        raise RuntimeError(f"the rebuilt model scores {accuracy:.4f}, the masked one "
                           f"{result.final_accuracy:.4f}: the rebuild lost what the masks kept")
    return small


def _fit_rebuilt(model, pruning, fit, compile_with, reference, eval_ds, epochs, strategy):
    """``--gradual_rebuild``: the masked model trains until the masks reach the plan (its
    ``--gradual_epochs``), the rebuilt smaller model the other epochs.

    The smaller model computes what the masked one does (checked) and takes the
    optimizer's state (``kp.GradualPruning.carry_optimizer``), so the run trains as
    the masked model would, at the smaller model's cost. A run cut short after the
    rebuild resumes the smaller model from its own backup (the plan's widths, its
    weights and optimizer restored); one cut short before refits nothing up to the
    cut (``BackupAndRestore``) and rebuilds from the restored masked model.
    """
    cut, backup = int(FLAGS.gradual_epochs), os.path.join(FLAGS.model_dir, _REBUILT_BACKUP)
    resumed = tf.io.gfile.exists(backup) and tf.io.gfile.listdir(backup)
    if resumed:  # the masked epochs were trained by an earlier process: skip their data passes
        small = compile_with(lambda: _trained(kp.apply_plan(reference, pruning.plan), reference))
        train.skip_epochs(fit.keywords["train_data"], cut, FLAGS.steps_per_epoch)
    else:
        result = fit(model, epochs=cut, callbacks=(pruning,))
        small = compile_with(lambda: _trained(_finalized(pruning.finalize(), result, eval_ds),
                                              reference))
    small.evaluate(eval_ds, steps=1, verbose=0)  # built, as BackupAndRestore wants
    if not resumed:
        with strategy.scope():
            pruning.carry_optimizer(small)
    result = fit(small, epochs=epochs, initial_epoch=cut, backup=_REBUILT_BACKUP)
    return dataclasses.replace(result, model=_student(small))


def _transfer_record(model, eval_ds, base_lr):
    """What ``results.json`` records of the starting point and the fine-tuning flags.

    ``pruned_accuracy`` is the test accuracy of the model to train (pruned,
    masked or as loaded), before any training: epoch 0 of a fine-tuning.
    """
    record = {"init_model": FLAGS.init_model, "keep_weights": FLAGS.keep_weights,
              "importance": (FLAGS.importance or "l1") if FLAGS.keep_weights else None,
              "distill": None, "base_lr": base_lr, "pruned_accuracy": None}
    if FLAGS.distill:
        record["distill"] = {"temperature": model.distillation_losses[0].temperature,
                             "alpha": model.student_loss_weight}
    if FLAGS.init_model:
        scores = model.evaluate(eval_ds, steps=FLAGS.eval_steps, return_dict=True, verbose=0)
        record["pruned_accuracy"] = scores["accuracy"]
        print(f"Test accuracy before training: {scores['accuracy']:.4f}")
    return record


def _masked_costs(profile, masks):
    """Parameters and MACs left by masks: a conv/dense layer's MACs scale with its kernel density."""
    densities = pai.layer_densities(masks)
    pruned = sum(int(mask.size - mask.sum()) for mask in masks.values())
    macs = sum(layer.macs * densities.get(f"{layer.name}/kernel", 1.0) for layer in profile.layers)
    return profile.total_params - pruned, int(round(macs))


def _costs(model, reference, masks):
    """Prints the table of the model to train; returns its params and MACs.

    Masked models get the per-weight kept/total table and their unpruned
    counts; the others get the ``profile`` table.
    """
    profile = kp.profile(model)
    if masks is None:
        profile.summary()
        params, macs = profile.total_params, profile.total_macs
    else:
        print(pai.sparsity_report(masks, model))
        params, macs = _masked_costs(profile, masks)
    original = kp.profile(reference)
    print(
        f"Training {FLAGS.method} {reference.name}: {params:,} params "
        f"({params / original.total_params:.1%}), {macs:,} MACs ({macs / original.total_macs:.1%}); "
        f"the original has {original.total_params:,} params, {original.total_macs:,} MACs"
    )
    return {
        "params": params,
        "macs": macs,
        "original_params": original.total_params,
        "original_macs": original.total_macs,
        "params_ratio": params / original.total_params,
        "macs_ratio": macs / original.total_macs,
    }


def _command():
    """This run's command line as ``results.json`` records it: the script relative to its checkout
    (whose commit is ``git_commit``), the flags as given. ``experiments/run.py`` gives paths
    relative to the repository, so the command reruns from any clone, on no path of this machine."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.relpath(os.path.abspath(sys.argv[0]), checkout)
    return " ".join([os.path.basename(sys.executable), script, *sys.argv[1:]])


def _git_commit():
    """``(commit, dirty)`` of the checkout these scripts run from, or ``(None, None)``."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "keras_precrop", "examples"],
            cwd=os.path.dirname(here),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, bool(status.strip())


def _export_init(model, record):
    """Writes the untrained model and what ``results.json`` would record before training."""
    tf.io.gfile.makedirs(FLAGS.model_dir)
    path = os.path.join(FLAGS.model_dir, "init_model.keras")
    model.save(path)
    with tf.io.gfile.GFile(os.path.join(FLAGS.model_dir, "init.json"), "w") as f:
        f.write(json.dumps(record, indent=1))
    print(f"Wrote the untrained model to {path} and its record to init.json; trained nothing.")


def _datasets(dataset, info, batch_size, reference, strategy):
    """``(train_ds, eval_ds, normalize)``: the splits of ``dataset`` as ``reference`` reads them.

    Inputs are normalized unless the model rescales them itself. TPUs and
    data-parallel JAX need whole global batches: the last partial test batch
    is skipped on them.
    """
    pipeline = dict(data_dir=FLAGS.data_dir, normalize=not data.model_rescales_inputs(reference))
    train_ds = data.load(dataset, info.train_split, batch_size, seed=FLAGS.seed, **pipeline)
    eval_ds = data.load(dataset, info.eval_split, batch_size, training=False,
                        drop_remainder=train.needs_static_batches(strategy), **pipeline)
    return train_ds, eval_ds, pipeline["normalize"]


def _gradual_record(pruning):
    """What ``results.json`` records of the ``--gradual_epochs`` callback (``None`` without it)."""
    if pruning is None:
        return None
    return {"epochs": FLAGS.gradual_epochs, "end_step": pruning.end_step,
            "frequency": pruning.frequency, "schedule": pruning.schedule,
            "importance": pruning.importance, "regrow": pruning.regrow,
            "shrink": pruning.shrink, "rebuild": FLAGS.gradual_rebuild}


def _record(dataset, recipe, epochs, batch_size, steps, strategy, normalize, pruning):
    """What ``results.json`` records before training: the command, the flags and the recipe."""
    commit, dirty = _git_commit()
    structured = FLAGS.init_model is not None and FLAGS.method in STRUCTURED
    return {
        "command": _command(), "git_commit": commit, "git_dirty": dirty,
        "dataset": dataset, "model": FLAGS.model, "method": FLAGS.method,
        "params_budget": FLAGS.params, "flops_budget": FLAGS.flops,
        "plan_options": _plan_options(), "plan_file": FLAGS.plan_file,
        "granularity": FLAGS.granularity if FLAGS.method == "random" else None,
        "densities": FLAGS.densities, "recipe": recipe.name, "epochs": epochs,
        "batch_size": batch_size, "steps_per_epoch": steps, "backend": keras.backend.backend(),
        "strategy": FLAGS.strategy, "replicas": strategy.num_replicas_in_sync, "seed": FLAGS.seed,
        "normalize": normalize,
        "prune": None if not structured else "oneshot" if pruning is None else "gradual",
        "gradual": _gradual_record(pruning),
    }


def _train(model, pruning, fit, compile_with, reference, eval_ds, epochs, strategy):
    """Trains ``model`` as the flags say: at once, masked gradually, or masked then rebuilt."""
    if pruning is None:
        return fit(model, epochs=epochs)
    if FLAGS.gradual_rebuild:
        return _fit_rebuilt(model, pruning, fit, compile_with, reference, eval_ds, epochs, strategy)
    result = fit(model, epochs=epochs, callbacks=(pruning,))
    return dataclasses.replace(result, model=_finalized(pruning.finalize(), result, eval_ds))


def _save_model(result, pruning):
    """``--save_model``: the trained model as ``final_model.keras``: the smaller model rebuilt from
    the masks, the student alone (not the ``Distiller`` with its teacher), or the last checkpoint."""
    if not FLAGS.save_model:
        return
    path = os.path.join(result.model_dir, "final_model.keras")
    if pruning is not None:
        result.model.save(path)
    elif FLAGS.distill:
        result.model.student.save(path)
    else:
        tf.io.gfile.copy(os.path.join(result.model_dir, "last.keras"), path, overwrite=True)


def _write_results(record, result, start):
    """Writes ``results.json``: ``record`` with the accuracies, times and history of ``result``."""
    results = {
        **record,
        "final_accuracy": result.final_accuracy,
        "best_accuracy": result.best_accuracy,
        "train_time_s": result.train_time,
        "wall_time_s": time.time() - start,
        "history": result.history,
    }
    path = os.path.join(result.model_dir, "results.json")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(results, indent=1))
    print(
        f"Final accuracy {result.final_accuracy:.4f}, best {result.best_accuracy:.4f}, "
        f"{result.train_time:.0f} s in epochs; wrote {path}"
    )


def run(dataset):
    """Trains ``FLAGS.model`` on ``dataset`` (``"cifar10"`` or ``"imagenet2012"``) as the flags say.

    ``results.json`` holds the flags and recipe used, ``params``/``macs`` of
    the trained model (unpruned weights only for masked models) and of the
    original, ``final_accuracy``/``best_accuracy`` on the test split,
    ``train_time_s`` (all epochs, over restarts), ``wall_time_s`` (this
    invocation, setup included) and ``history`` (one dict per epoch).
    """
    start = time.time()
    _check_flags()
    if keras.backend.backend() != "tensorflow":
        # TensorFlow only feeds the input pipeline: keep it off the accelerators.
        tf.config.set_visible_devices([], "GPU")
    strategy = train.get_strategy(FLAGS.strategy, tpu=FLAGS.tpu)  # before any other TF op
    keras.utils.set_random_seed(FLAGS.seed)
    info = data.get_info(dataset)
    recipe = train.get_recipe(dataset, FLAGS.model)
    if FLAGS.learning_rate is not None:
        recipe = dataclasses.replace(recipe, base_lr=FLAGS.learning_rate)
    epochs = FLAGS.epochs or recipe.epochs
    batch_size = FLAGS.batch_size or recipe.batch_size

    reference = kp.models.get(FLAGS.model, input_shape=info.input_shape, num_classes=info.num_classes)
    if FLAGS.init_model:
        reference = _init_model(reference)
    train_ds, eval_ds, normalize = _datasets(dataset, info, batch_size, reference, strategy)
    steps = FLAGS.steps_per_epoch or train.steps_per_epoch(train_ds)

    build_model, masks = _builder(reference, train_ds, info.num_classes, batch_size)
    compile_with = functools.partial(
        train.compile_model, recipe=recipe, steps_per_epoch=steps, global_batch_size=batch_size,
        epochs=epochs, strategy=strategy, steps_per_execution=FLAGS.steps_per_execution,
    )
    model = compile_with(build_model)
    pruning = _gradual_pruning(reference, train_ds, batch_size, steps)
    costs = _costs(_student(model) if pruning is None else kp.apply_plan(reference, pruning.plan),
                   reference, masks)
    record = {**_record(dataset, recipe, epochs, batch_size, steps, strategy, normalize, pruning),
              **costs, **_transfer_record(model, eval_ds, recipe.base_lr)}
    if FLAGS.export_init:
        _export_init(model, record)
        return
    fit = functools.partial(train.fit, train_data=train_ds, eval_data=eval_ds, model_dir=FLAGS.model_dir,
                            steps_per_epoch=FLAGS.steps_per_epoch, eval_steps=FLAGS.eval_steps,
                            verbose=FLAGS.verbose)
    result = _train(model, pruning, fit, compile_with, reference, eval_ds, epochs, strategy)
    _save_model(result, pruning)
    _write_results(record, result, start)
