"""Training with ``model.fit`` under tf.distribute strategies, seed-paper recipes.

* ``get_strategy``: ``"auto"``, ``"default"``, ``"mirrored"``,
  ``"multiworker"`` or ``"tpu"``.
* ``RECIPES`` / ``get_recipe``: the seed paper's Table "Hyperparameters used
  in training" (momentum SGD; epochs, batch size, learning rate schedule and
  weight decay per dataset and model family).
* ``learning_rate_schedule`` / ``make_optimizer``: the schedules with the
  learning rate scaled linearly with the global batch size, and ``SGDWithL2``.
* ``compile_model``: builds and compiles a model inside ``strategy.scope()``.
* ``fit``: trains with ``BackupAndRestore`` (a killed run resumes at the next
  epoch), best/last ``.keras`` checkpoints, TensorBoard and a CSV log that
  keeps the per-epoch history across restarts.
"""

import csv
import dataclasses
import importlib.util
import logging
import os
import time

import keras
import tensorflow as tf

from keras_precrop import progress as _progress
from keras_precrop.optimizers import SGDWithL2

STRATEGIES = ("auto", "default", "mirrored", "multiworker", "tpu")

_logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One column of the seed paper's training-hyperparameter table.

    Attributes:
        name: key in ``RECIPES``.
        epochs: training epochs.
        batch_size: reference global batch size; ``base_lr`` belongs to it.
        base_lr: initial learning rate at ``batch_size``.
        schedule: ``"linear"`` (decay to 0 over the run), ``"exponential"``
            (multiply by ``decay_rate`` after every epoch) or ``"step"``
            (multiply by ``decay_rate`` at each epoch in ``drop_epochs``).
        decay_rate: factor of the exponential and step schedules.
        drop_epochs: epochs (0-based) from which the step schedule's next drop
            applies.
        weight_decay: L2 coefficient, applied to conv/dense kernels only.
        momentum: SGD momentum.
    """

    name: str
    epochs: int
    batch_size: int
    base_lr: float
    schedule: str
    weight_decay: float
    decay_rate: float = 1.0
    drop_epochs: tuple = ()
    momentum: float = 0.9


RECIPES = {
    recipe.name: recipe
    for recipe in (
        Recipe("cifar10", 160, 128, 0.1, "linear", 1e-4),
        Recipe("imagenet_mobilenet", 180, 256, 0.025, "exponential", 4e-5, decay_rate=0.98),
        Recipe("imagenet_resnet", 90, 512, 0.2, "step", 1e-4, decay_rate=0.1, drop_epochs=(30, 60)),
        Recipe("imagenet_efficientnet", 150, 256, 0.035, "exponential", 4e-5, decay_rate=0.99),
    )
}

# ImageNet recipe per model-name prefix (the paper has one column per family).
_IMAGENET_FAMILIES = (
    ("mobilenet", "imagenet_mobilenet"),
    ("resnet", "imagenet_resnet"),
    ("efficientnet", "imagenet_efficientnet"),
)


def get_recipe(dataset, model_name):
    """Returns the paper's recipe for a dataset and model.

    All CIFAR-10 models share one recipe; on ImageNet the model family (the
    name's prefix: ``mobilenet``, ``resnet`` or ``efficientnet``) picks it.

    Raises:
        ValueError: for an unknown dataset or an ImageNet model of no family.
    """
    if dataset == "cifar10":
        return RECIPES["cifar10"]
    if dataset != "imagenet2012":
        raise ValueError(f"No training recipe for dataset {dataset!r}; use 'cifar10' or 'imagenet2012'.")
    for prefix, recipe in _IMAGENET_FAMILIES:
        if model_name.startswith(prefix):
            return RECIPES[recipe]
    raise ValueError(
        f"No ImageNet recipe for model {model_name!r}: the name must start with one of "
        f"{', '.join(prefix for prefix, _ in _IMAGENET_FAMILIES)}; or pick a recipe from "
        f"keras_precrop.train.RECIPES ({', '.join(RECIPES)}) yourself."
    )


def scaled_learning_rate(recipe, global_batch_size):
    """Linear scaling rule: ``base_lr * global_batch_size / recipe.batch_size``."""
    if not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive int, got {global_batch_size!r}.")
    return recipe.base_lr * global_batch_size / recipe.batch_size


def learning_rate_schedule(recipe, steps_per_epoch, global_batch_size, epochs=None):
    """Builds the recipe's learning rate schedule as a function of the step.

    The optimizer evaluates the schedule at ``iterations`` (0 for the first
    update), so epoch ``e`` (0-based) starts at step ``e * steps_per_epoch``:

    * linear: ``lr0 * (1 - step / (epochs * steps_per_epoch))``, so the
      learning rate reaches 0 at the end of the run actually trained;
    * exponential: ``lr0 * decay_rate ** floor(step / steps_per_epoch)``;
    * step: ``lr0 * decay_rate ** (number of drop epochs <= e)``.

    ``lr0`` is ``scaled_learning_rate(recipe, global_batch_size)``.

    Args:
        recipe: a ``Recipe``.
        steps_per_epoch: optimizer steps per epoch.
        global_batch_size: examples per step over all replicas.
        epochs: length of the run for the linear schedule; None for
            ``recipe.epochs``.

    Returns:
        A serializable ``keras.optimizers.schedules.LearningRateSchedule``.

    Raises:
        ValueError: for non-positive steps/epochs or an unknown schedule.
    """
    if not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be a positive int, got {steps_per_epoch!r}.")
    epochs = recipe.epochs if epochs is None else epochs
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}.")
    lr0 = scaled_learning_rate(recipe, global_batch_size)
    schedules = keras.optimizers.schedules
    if recipe.schedule == "linear":
        return schedules.PolynomialDecay(lr0, epochs * steps_per_epoch, end_learning_rate=0.0, power=1.0)
    if recipe.schedule == "exponential":
        return schedules.ExponentialDecay(lr0, steps_per_epoch, recipe.decay_rate, staircase=True)
    if recipe.schedule == "step":
        # PiecewiseConstantDecay switches when step > boundary.
        boundaries = [epoch * steps_per_epoch - 1 for epoch in recipe.drop_epochs]
        values = [lr0 * recipe.decay_rate**i for i in range(len(boundaries) + 1)]
        return schedules.PiecewiseConstantDecay(boundaries, values)
    raise ValueError(f"Unknown schedule {recipe.schedule!r}; use 'linear', 'exponential' or 'step'.")


def make_optimizer(recipe, steps_per_epoch, global_batch_size, epochs=None):
    """Returns the recipe's ``SGDWithL2`` with its scaled learning rate schedule."""
    return SGDWithL2(
        l2=recipe.weight_decay,
        learning_rate=learning_rate_schedule(recipe, steps_per_epoch, global_batch_size, epochs),
        momentum=recipe.momentum,
    )


def _tpu_present(tpu):
    """Cheap TPU detection that never waits on a metadata server."""
    if tpu or os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR"):
        return True
    return bool(tf.config.list_physical_devices("TPU"))


def _tpu_strategy(tpu):
    """Connects to a TPU (Colab, TPU VM ``"local"`` or a named TPU node)."""
    if tpu is None:
        tpu = "" if os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR") else "local"
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _mirrored_strategy():
    """Mirrors over all GPUs, or over all logical CPUs when there is no GPU."""
    if tf.config.list_logical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])


class _MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """``MultiWorkerMirroredStrategy`` with a ``reduce`` that Keras 3 can use.

    Keras 3's TensorFlow trainer calls ``strategy.reduce`` on a whole
    ``(images, labels)`` batch (to learn its shapes) and on scalar metrics
    with ``axis=0``; TensorFlow's collective strategy only reduces single
    values and cannot reduce a scalar along an axis. This reduces leaf by leaf
    and reduces scalars across replicas only, which is what every other
    strategy returns for them.
    """

    def reduce(self, reduce_op, value, axis):
        """Reduces each leaf of ``value`` across replicas (and along ``axis`` if it has one)."""

        def reduce_leaf(leaf):
            local = leaf.values[0] if isinstance(leaf, tf.distribute.DistributedValues) else leaf
            leaf_axis = None if local.shape.rank == 0 else axis
            return super(_MultiWorkerMirroredStrategy, self).reduce(reduce_op, leaf, leaf_axis)

        return tf.nest.map_structure(reduce_leaf, value)


def get_strategy(name="auto", tpu=None):
    """Creates a ``tf.distribute`` strategy by name.

    Call it first thing in a program: ``MultiWorkerMirroredStrategy`` and TPU
    initialization must happen before other TensorFlow ops run.

    Args:
        name: ``"auto"`` (TPU if one is configured or attached, else mirrored
            if there are several GPUs, else default), ``"default"`` (no
            distribution), ``"mirrored"`` (all local GPUs; all logical CPUs
            when there is no GPU), ``"multiworker"`` (``MultiWorkerMirrored``
            configured by the ``TF_CONFIG`` environment variable) or ``"tpu"``.
        tpu: TPU name or address for ``TPUClusterResolver``; None uses
            Colab's/``TPU_NAME``'s TPU, or the local TPU VM.

    Returns:
        A ``tf.distribute.Strategy``.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}.")
    if name == "auto":
        if _tpu_present(tpu):
            return _tpu_strategy(tpu)
        name = "mirrored" if len(tf.config.list_physical_devices("GPU")) > 1 else "default"
    if name == "tpu":
        return _tpu_strategy(tpu)
    if name == "mirrored":
        return _mirrored_strategy()
    if name == "multiworker":
        return _MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def steps_per_epoch(dataset):
    """Returns the (finite, known) number of batches of a ``tf.data.Dataset``.

    Raises:
        ValueError: if the cardinality is infinite or unknown.
    """
    cardinality = int(dataset.cardinality())
    if cardinality < 1:
        raise ValueError(
            f"Cannot infer steps per epoch: the dataset's cardinality is {cardinality} "
            "(infinite, unknown or empty); pass steps_per_epoch explicitly."
        )
    return cardinality


def _check_returns_logits(model):
    """Refuses models ending in softmax: the loss is computed from logits."""
    activation = getattr(model.layers[-1], "activation", None)
    if activation is keras.activations.softmax or isinstance(model.layers[-1], keras.layers.Softmax):
        raise ValueError(
            f"Model {model.name!r} ends in a softmax ({model.layers[-1].name!r}); "
            "keras_precrop.train expects logits. Build it without the final softmax "
            "(e.g. classifier_activation=None)."
        )


def compile_model(
    build_model,
    recipe,
    *,
    steps_per_epoch,
    global_batch_size,
    epochs=None,
    strategy=None,
    steps_per_execution=1,
):
    """Builds and compiles a classifier inside ``strategy.scope()``.

    Args:
        build_model: zero-argument callable returning an uncompiled
            ``keras.Model`` with logits output; called inside the scope so its
            variables are distributed.
        recipe: a ``Recipe`` (optimizer, schedule, weight decay).
        steps_per_epoch: optimizer steps per epoch (for the schedule).
        global_batch_size: examples per step over all replicas (for linear
            learning-rate scaling).
        epochs: training epochs (for the linear schedule); None for
            ``recipe.epochs``.
        strategy: a ``tf.distribute.Strategy``; None for the current one.
        steps_per_execution: steps per ``tf.function`` call (raise on TPUs).

    Returns:
        The compiled model (sparse categorical cross-entropy from logits and
        accuracy).
    """
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = build_model()
        if not isinstance(model, keras.Model):
            raise TypeError(f"build_model must return a keras.Model, got {type(model).__name__}.")
        _check_returns_logits(model)
        model.compile(
            optimizer=make_optimizer(recipe, steps_per_epoch, global_batch_size, epochs),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
    return model


class _EpochStats(keras.callbacks.Callback):
    """Adds the epoch's learning rate and wall time (training + evaluation) to the logs."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._learning_rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self._learning_rate
            logs["epoch_time"] = time.perf_counter() - self._start


class _PlainProgressLogger(keras.callbacks.Callback):
    """Plain progress lines within each epoch, for output that is not a terminal.

    ``fit`` pairs it with Keras' ``verbose=2`` (an ``Epoch i/n`` header and
    one line at the end of each epoch), so a log shows progress inside long
    epochs without Keras' progress-bar control characters.
    """

    def __init__(self, interval):
        super().__init__()
        self._interval = interval

    def on_epoch_begin(self, epoch, logs=None):
        self._progress = _progress.PlainProgress(self.params.get("steps"), self._interval, last_line=False)

    def on_train_batch_end(self, batch, logs=None):
        self._progress.update(batch + 1, logs or {})


@dataclasses.dataclass
class TrainResult:
    """What ``fit`` returns.

    Attributes:
        model: the trained model.
        history: one dict per epoch (``epoch``, ``loss``, ``accuracy``,
            ``val_loss``, ``val_accuracy``, ``learning_rate``, ``epoch_time``),
            including epochs trained before a restart.
        model_dir: the directory this process wrote (checkpoints, logs).
    """

    model: keras.Model
    history: list
    model_dir: str

    def _metric(self, key):
        values = [row[key] for row in self.history if key in row]
        if not values:
            raise ValueError(f"No {key!r} in the history; was fit called with eval data?")
        return values

    @property
    def final_accuracy(self):
        """Evaluation accuracy after the last epoch."""
        return self._metric("val_accuracy")[-1]

    @property
    def best_accuracy(self):
        """Best evaluation accuracy of any epoch."""
        return max(self._metric("val_accuracy"))

    @property
    def train_time(self):
        """Seconds spent in all epochs, over all restarts."""
        return sum(self._metric("epoch_time"))


def read_history(model_dir):
    """Reads the per-epoch history ``fit`` logged to ``model_dir/history.csv``.

    A run killed after logging an epoch but before backing it up repeats that
    epoch when resumed; the later row wins.

    Returns:
        A list of dicts sorted by epoch (``epoch`` is an int, the rest floats;
        metrics Keras logged as ``NA``, e.g. ``val_*`` without evaluation
        data, are left out); empty if nothing was logged yet.
    """
    path = os.path.join(model_dir, "history.csv")
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as f:
        rows = {int(row["epoch"]): row for row in csv.DictReader(f)}
    return [
        {"epoch": epoch, **{k: float(v) for k, v in rows[epoch].items() if k != "epoch" and v != "NA"}}
        for epoch in sorted(rows)
    ]


def _worker_dir(model_dir, strategy):
    """The chief writes ``model_dir``; other workers write private subfolders.

    Every multi-worker replica runs the callbacks, and two processes must not
    write the same checkpoint files.
    """
    if strategy.extended.should_checkpoint:
        return model_dir
    return os.path.join(model_dir, f"worker_{strategy.cluster_resolver.task_id}")


def _use_tensorboard(tensorboard):
    """Resolves ``fit``'s ``tensorboard`` argument against the installed packages."""
    installed = importlib.util.find_spec("tensorboard") is not None
    if tensorboard and not installed:
        raise ImportError("fit(tensorboard=True) needs the `tensorboard` package: pip install tensorboard.")
    if tensorboard is None and not installed:
        _logger.warning("The `tensorboard` package is not installed; training without TensorBoard logs.")
    return installed if tensorboard is None else bool(tensorboard)


def _callbacks(model_dir, history, monitor, tensorboard):
    """Built-in callbacks, in the order that keeps the CSV log and backup consistent."""
    best = [row[monitor] for row in history if monitor in row]
    mode = "min" if "loss" in monitor else "max"
    callbacks = [
        _EpochStats(),
        keras.callbacks.CSVLogger(os.path.join(model_dir, "history.csv"), append=True),
        keras.callbacks.ModelCheckpoint(
            os.path.join(model_dir, "best.keras"),
            monitor=monitor,
            mode=mode,
            save_best_only=True,
            initial_value_threshold=(min(best) if mode == "min" else max(best)) if best else None,
        ),
        keras.callbacks.ModelCheckpoint(os.path.join(model_dir, "last.keras")),
    ]
    if tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(model_dir, "tensorboard")))
    # Last: an epoch is only marked done after everything above logged it.
    callbacks.append(
        keras.callbacks.BackupAndRestore(os.path.join(model_dir, "backup"), delete_checkpoint=False)
    )
    return callbacks


def fit(
    model,
    train_data,
    eval_data=None,
    *,
    model_dir,
    epochs,
    steps_per_epoch=None,
    eval_steps=None,
    callbacks=(),
    tensorboard=None,
    verbose=1,
    log_every=30.0,
):
    """Trains a compiled model, resuming from ``model_dir`` if a run was cut short.

    Writes into ``model_dir``: ``history.csv`` (one row per epoch, kept across
    restarts), ``best.keras`` (best evaluation accuracy, or lowest training
    loss without ``eval_data``), ``last.keras``, ``tensorboard/`` and
    ``backup/`` (``BackupAndRestore``: a killed run restarted with the same
    arguments continues after the last finished epoch, with the optimizer
    state and schedule position restored). Rerunning a finished run trains
    nothing and returns its history.

    Args:
        model: a model from ``compile_model``.
        train_data: ``tf.data.Dataset`` of ``(images, labels)`` global batches.
        eval_data: evaluation dataset, or None.
        model_dir: output directory (local or ``gs://``).
        epochs: total epochs, counting those trained before a restart.
        steps_per_epoch: batches per epoch; None for the whole dataset.
        eval_steps: evaluation batches; None for the whole dataset.
        callbacks: extra callbacks, run after the built-in ones.
        tensorboard: write TensorBoard logs; None does so if the
            ``tensorboard`` package is installed (and warns if not), True
            requires it.
        verbose: 0 silent; 1 progress within epochs (Keras' progress bar on
            a terminal or in a notebook, else a plain line every
            ``log_every`` seconds, so log files hold no control characters);
            2 one line per epoch.
        log_every: seconds between the plain progress lines of ``verbose=1``.

    Returns:
        A ``TrainResult``.
    """
    model_dir = _worker_dir(model_dir, model.distribute_strategy)
    tf.io.gfile.makedirs(model_dir)
    monitor = "val_accuracy" if eval_data is not None else "loss"
    progress = []
    if verbose == 1 and not _progress.interactive():
        verbose, progress = 2, [_PlainProgressLogger(log_every)]
    model.fit(
        train_data,
        validation_data=eval_data,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        validation_steps=eval_steps,
        shuffle=False,  # tf.data pipelines shuffle themselves
        callbacks=_callbacks(model_dir, read_history(model_dir), monitor, _use_tensorboard(tensorboard))
        + list(callbacks)
        + progress,
        verbose=verbose,
    )
    return TrainResult(model=model, history=read_history(model_dir), model_dir=model_dir)
