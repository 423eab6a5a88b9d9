"""Training with ``model.fit`` under a distribution strategy, seed-paper recipes.

* ``get_strategy``: ``"auto"``, ``"default"``, ``"mirrored"``,
  ``"multiworker"`` or ``"tpu"``: a ``tf.distribute`` strategy on TensorFlow,
  Keras' own distribution API (``keras.distribution.DataParallel``) on JAX,
  and no distribution on PyTorch.
* ``RECIPES`` / ``get_recipe``: the seed paper's Table "Hyperparameters used
  in training" (momentum SGD; epochs, batch size, learning rate schedule and
  weight decay per dataset and model family).
* ``learning_rate_schedule`` / ``make_optimizer``: the schedules with the
  learning rate scaled linearly with the global batch size, and ``SGDWithL2``.
* ``compile_model``: builds and compiles a model inside ``strategy.scope()``.
  Recipes, the optimizer, ``compile_model`` and ``fit`` work on every Keras
  backend; only the ``tf.distribute`` strategies (and ``gs://`` paths) need
  TensorFlow, and say so when it is missing.
* ``fit``: trains with ``BackupAndRestore`` (a killed run resumes at the next
  epoch), best/last ``.keras`` checkpoints, TensorBoard and a CSV log that
  keeps the per-epoch history across restarts.
"""

import contextlib
import csv
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
import types

import keras

from keras_precrop import progress as _progress
from keras_precrop.training.optimizers import SGDWithL2

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


def _tensorflow(feature):
    """Imports TensorFlow for ``feature``, or raises an ImportError saying how to install it."""
    try:
        return importlib.import_module("tensorflow")
    except ImportError as err:
        raise ImportError(
            f"keras_precrop.train: {feature} needs TensorFlow, which is not installed. "
            "Install one flavour of it, e.g. `pip install keras-precrop[cpu]` (CPU only), "
            "`keras-precrop[gpu]` (CUDA) or `keras-precrop[tf]`."
        ) from err


def _tpu_present(tpu):
    """Cheap TPU detection that never waits on a metadata server."""
    if tpu or os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR"):
        return True
    return bool(_tensorflow("TPU detection").config.list_physical_devices("TPU"))


def _tpu_strategy(tpu):
    """Connects to a TPU (Colab, TPU VM ``"local"`` or a named TPU node)."""
    tf = _tensorflow("the TPU strategy")
    if tpu is None:
        tpu = "" if os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR") else "local"
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _mirrored_strategy():
    """Mirrors over all GPUs, or over all logical CPUs when there is no GPU."""
    tf = _tensorflow("the mirrored strategy")
    if tf.config.list_logical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])


def _multiworker_strategy():
    """A ``MultiWorkerMirroredStrategy`` with a ``reduce`` that Keras 3 can use.

    Keras 3's TensorFlow trainer calls ``strategy.reduce`` on a whole
    ``(images, labels)`` batch (to learn its shapes) and on scalar metrics
    with ``axis=0``; TensorFlow's collective strategy only reduces single
    values and cannot reduce a scalar along an axis. The subclass reduces leaf
    by leaf and reduces scalars across replicas only, which is what every
    other strategy returns for them.
    """
    tf = _tensorflow("the multiworker strategy")

    class _MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis):
            """Reduces each leaf of ``value`` across replicas (and along ``axis`` if it has one)."""

            def reduce_leaf(leaf):
                local = leaf.values[0] if isinstance(leaf, tf.distribute.DistributedValues) else leaf
                leaf_axis = None if local.shape.rank == 0 else axis
                return super(_MultiWorkerMirroredStrategy, self).reduce(reduce_op, leaf, leaf_axis)

            return tf.nest.map_structure(reduce_leaf, value)

    return _MultiWorkerMirroredStrategy()


class KerasDistribution:
    """A Keras distribution (JAX) with the members train and the examples use from a strategy.

    ``keras.distribution`` is Keras' backend-independent distribution API;
    Keras implements it on JAX, where it shards each global batch over the
    devices of a mesh and replicates the weights (``DataParallel``). A
    distribution is global: :func:`get_strategy` sets it for the whole
    program, as ``model.fit`` reads it when it distributes the data.

    Attributes:
        distribution: the ``keras.distribution.Distribution``, or None for a
            single device (PyTorch, or JAX without distribution).
    """

    def __init__(self, distribution=None):
        self.distribution = distribution

    @property
    def num_replicas_in_sync(self):
        """Devices a global batch is split over (1 without distribution)."""
        return 1 if self.distribution is None else int(self.distribution.device_mesh.devices.size)

    def scope(self):
        """The distribution's scope: variables created in it are laid out on its devices."""
        return contextlib.nullcontext() if self.distribution is None else self.distribution.scope()

    def __repr__(self):
        return f"KerasDistribution({self.distribution!r}, replicas={self.num_replicas_in_sync})"


def _jax_strategy(name):
    """``DataParallel`` over the JAX devices ``name`` asks for, set as the global distribution."""
    devices = keras.distribution.list_devices()
    if name == "tpu":
        try:
            devices = keras.distribution.list_devices("tpu")
        except RuntimeError:  # JAX has no TPU backend here
            devices = []
        if not devices:
            raise ValueError("get_strategy('tpu') on JAX found no TPU device (jax.devices('tpu') is empty).")
    elif name == "auto" and len(devices) == 1:
        name = "default"
    if name == "default":
        keras.distribution.set_distribution(None)
        return KerasDistribution()
    distribution = keras.distribution.DataParallel(devices=devices)
    keras.distribution.set_distribution(distribution)
    return KerasDistribution(distribution)


def get_strategy(name="auto", tpu=None):
    """Creates the distribution strategy ``name`` on the current Keras backend.

    Call it first thing in a program: ``MultiWorkerMirroredStrategy`` and TPU
    initialization must happen before other TensorFlow ops run, and on JAX
    the distribution is set globally.

    On TensorFlow: ``"auto"`` (TPU if one is configured or attached, else
    mirrored if there are several GPUs, else default), ``"default"`` (no
    distribution), ``"mirrored"`` (all local GPUs; all logical CPUs when there
    is no GPU), ``"multiworker"`` (``MultiWorkerMirrored`` configured by the
    ``TF_CONFIG`` environment variable) or ``"tpu"``.

    On JAX: ``keras.distribution.DataParallel`` over the devices of
    ``keras.distribution.list_devices()`` for ``"mirrored"`` and for
    ``"auto"`` when there are several (``"tpu"``: the TPU cores), no
    distribution for ``"default"``. On PyTorch, which Keras does not
    distribute: ``"auto"`` and ``"default"`` (a single device).

    Args:
        name: one of ``STRATEGIES``.
        tpu: TPU name or address for ``TPUClusterResolver`` (TensorFlow); None
            uses Colab's/``TPU_NAME``'s TPU, or the local TPU VM.

    Returns:
        A ``tf.distribute.Strategy`` on TensorFlow, else a
        :class:`KerasDistribution`; both have ``scope()`` and
        ``num_replicas_in_sync``.

    Raises:
        ValueError: for an unknown name, or one the backend cannot run.
        ImportError: for a ``tf.distribute`` strategy without TensorFlow.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}.")
    backend = keras.backend.backend()
    if backend != "tensorflow":
        supported = {"jax": ("auto", "default", "mirrored", "tpu")}.get(backend, ("auto", "default"))
        if name not in supported:
            raise ValueError(
                f"Strategy {name!r} is not available on the {backend} backend; use one of "
                f"{', '.join(supported)} (multi-worker training needs the TensorFlow backend)."
            )
        return _jax_strategy(name) if backend == "jax" else KerasDistribution()
    if name == "auto":
        if _tpu_present(tpu):
            return _tpu_strategy(tpu)
        gpus = _tensorflow("strategy 'auto'").config.list_physical_devices("GPU")
        name = "mirrored" if len(gpus) > 1 else "default"
    if name == "tpu":
        return _tpu_strategy(tpu)
    if name == "mirrored":
        return _mirrored_strategy()
    if name == "multiworker":
        return _multiworker_strategy()
    return _tensorflow("strategy 'default'").distribute.get_strategy()


def _default_strategy():
    """The strategy in effect: TensorFlow's current one, else the global Keras distribution."""
    if keras.backend.backend() == "tensorflow":
        return _tensorflow("the default strategy").distribute.get_strategy()
    return KerasDistribution(keras.distribution.distribution())


def needs_static_batches(strategy):
    """Whether every batch must have the global batch size under ``strategy``.

    TPUs need static shapes, and a data-parallel Keras distribution splits
    each batch evenly over its devices, so input pipelines drop the last
    partial batch there (also when evaluating).
    """
    if isinstance(strategy, KerasDistribution):
        return strategy.num_replicas_in_sync > 1
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(strategy, tf.distribute.TPUStrategy)


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
        strategy: from :func:`get_strategy`; None for the current one.
        steps_per_execution: steps per ``tf.function`` call (raise on TPUs).

    Returns:
        The compiled model (sparse categorical cross-entropy from logits and
        accuracy).
    """
    strategy = strategy or _default_strategy()
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
    files = _files(path)
    if not files.exists(path):
        return []
    with files.GFile(path) as f:
        rows = {int(row["epoch"]): row for row in csv.DictReader(f)}
    return [
        {"epoch": epoch, **{k: float(v) for k, v in rows[epoch].items() if k != "epoch" and v != "NA"}}
        for epoch in sorted(rows)
    ]


def _files(path):
    """File operations for ``path``: ``tf.io.gfile`` for remote paths (``gs://``), else the local ones."""
    if "://" in str(path):
        return _tensorflow(f"the remote path {path!r}").io.gfile
    return types.SimpleNamespace(
        exists=os.path.exists, GFile=open, makedirs=lambda p: os.makedirs(p, exist_ok=True)
    )


def skip_epochs(train_data, epochs, steps_per_epoch=None):
    """Advances ``train_data`` (a ``tf.data.Dataset``) past ``epochs`` whole epochs without reading it.

    A pipeline that shuffles or augments with a seed (``make_pipeline``) draws
    each epoch's order and augmentations from the number of iterations made
    over it, and a restarted process builds it afresh: a resumed run would
    replay the first epoch's images instead of the epochs it has not trained.
    Making an iterator and dropping it advances those seeds as an epoch's
    iterators do, so the next epoch sees what an uninterrupted run sees
    (tests/test_train.py and tests/test_backends.py check it against one).
    Keras' ``fit`` on TensorFlow makes two an epoch where ``steps_per_epoch``
    is None (one to train on, one made as the pass ends) and one where it is
    the dataset's batches; on JAX and PyTorch it reads the dataset through a
    generator, which makes its iterator once read: one an epoch. Under
    ``tf.distribute`` strategies (mirrored, multi-worker) the dataset Keras
    distributes draws from the given one's seeds, so the same count holds.
    Nothing is done for other data, for ``epochs`` below 1, or where an epoch
    is not one pass (other ``steps_per_epoch``: Keras then keeps one iterator
    across epochs).

    Args:
        train_data: the training data that ``fit`` will read, not yet read in
            this process past the epochs to skip.
        epochs: the epochs already trained on it elsewhere (a killed process).
        steps_per_epoch: as given to ``fit``.
    """
    tf = sys.modules.get("tensorflow")
    if epochs < 1 or tf is None or not isinstance(train_data, tf.data.Dataset):
        return
    batches = int(train_data.cardinality())
    if batches < 0 or steps_per_epoch not in (None, batches):  # infinite, unknown, or partial epochs
        return
    twice = steps_per_epoch is None and keras.backend.backend() == "tensorflow"
    for _ in range(epochs * (2 if twice else 1)):
        iter(train_data)


def _backed_up_epochs(backup_dir):
    """The epochs ``BackupAndRestore`` recorded as trained in ``backup_dir`` (0 without a backup)."""
    path = os.path.join(backup_dir, "training_metadata.json")
    files = _files(path)
    if not files.exists(path):
        return 0
    with files.GFile(path, "r") as f:
        return int(json.load(f)["epoch"])


def _check_history_has_its_backup(model_dir, history, backup, backed_up, initial_epoch):
    """Refuses to train again over a history whose backup is gone.

    ``history.csv`` may be one epoch ahead of the backup (a kill between logging
    an epoch and backing it up; the epoch is trained again and its row
    replaced). More rows than that mean the backup was lost (deleted, or not
    copied with the folder): training would start over from ``initial_epoch``
    and mix two runs' epochs in one history, and ``best.keras`` would be judged
    against the lost run's accuracy.

    Raises:
        ValueError: naming ``model_dir``, the epochs logged and the epochs backed up.
    """
    logged = [row["epoch"] for row in history]
    if logged and logged[-1] > max(backed_up, initial_epoch):  # more than one epoch ahead
        raise ValueError(
            f"fit(model_dir={model_dir!r}): history.csv logs epochs {logged[0]}-{logged[-1]}, but "
            f"{backup}/ (BackupAndRestore) holds {backed_up} trained epochs: the backup was lost, and "
            f"training again would mix two runs in one history. Restore {backup}/ to resume, or "
            "remove history.csv (or pass another model_dir) to start over."
        )


def _worker_dir(model_dir, model):
    """The chief writes ``model_dir``; other workers write private subfolders.

    Every multi-worker replica runs the callbacks, and two processes must not
    write the same checkpoint files. (Multi-worker training is TensorFlow's.)
    """
    if keras.backend.backend() != "tensorflow":
        return model_dir
    strategy = model.distribute_strategy
    if strategy.extended.should_checkpoint:
        return model_dir
    return os.path.join(model_dir, f"worker_{strategy.cluster_resolver.task_id}")


def _use_tensorboard(tensorboard):
    """Resolves ``fit``'s ``tensorboard`` argument against the installed packages.

    Keras writes TensorBoard logs with ``tf.summary``, so TensorFlow is needed
    too, whatever the backend.
    """
    missing = [name for name in ("tensorboard", "tensorflow") if importlib.util.find_spec(name) is None]
    if tensorboard and missing:
        raise ImportError(
            f"fit(tensorboard=True) needs the {' and '.join(missing)} package(s): "
            f"pip install {' '.join(missing)}."
        )
    if tensorboard is None and missing:
        _logger.warning(
            "The %s package is not installed; training without TensorBoard logs.", " and ".join(missing)
        )
    return not missing if tensorboard is None else bool(tensorboard)


def _callbacks(model_dir, history, monitor, tensorboard, backup):
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
        keras.callbacks.BackupAndRestore(os.path.join(model_dir, backup), delete_checkpoint=False)
    )
    return callbacks


def fit(
    model,
    train_data,
    eval_data=None,
    *,
    model_dir,
    epochs,
    initial_epoch=0,
    steps_per_epoch=None,
    eval_steps=None,
    callbacks=(),
    tensorboard=None,
    verbose=1,
    log_every=30.0,
    backup="backup",
):
    """Trains a compiled model, resuming from ``model_dir`` if a run was cut short.

    Writes into ``model_dir``: ``history.csv`` (one row per epoch, kept across
    restarts), ``best.keras`` (best evaluation accuracy, or lowest training
    loss without ``eval_data``), ``last.keras``, ``tensorboard/`` and
    ``backup/`` (``BackupAndRestore``: a killed run restarted with the same
    arguments continues after the last finished epoch, with the optimizer
    state, schedule position and data order restored). Rerunning a finished run trains
    nothing and returns its history.

    Args:
        model: a model from ``compile_model``, or any compiled model; one not built yet
            (a ``keras.distillation.Distiller``) is built for ``train_data``'s inputs.
        train_data: ``tf.data.Dataset`` of ``(images, labels)`` global batches.
        eval_data: evaluation dataset, or None.
        model_dir: output directory (local or ``gs://``).
        epochs: total epochs, counting those trained before a restart.
        initial_epoch: the epoch to start from when there is no backup yet
            (a model that takes over from another one's training), and the
            epoch ``train_data``'s next pass is for: a run resumed from a
            backup first skips the passes from there to the backup's epoch
            (:func:`skip_epochs`), so it trains on the epochs' own shuffles
            and augmentations, not the first epoch's again.
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
        backup: the folder of ``model_dir`` the backup goes to: one per model
            that trains there (a model rebuilt smaller mid-run has its own).

    Returns:
        A ``TrainResult``.
    """
    model_dir = _worker_dir(model_dir, model)
    _files(model_dir).makedirs(model_dir)
    _build_for_backup(model, train_data)
    backed_up, history = _backed_up_epochs(os.path.join(model_dir, backup)), read_history(model_dir)
    _check_history_has_its_backup(model_dir, history, backup, backed_up, initial_epoch)
    skip_epochs(train_data, backed_up - initial_epoch, steps_per_epoch)
    monitor = "val_accuracy" if eval_data is not None else "loss"
    progress = []
    if verbose == 1 and not _progress.interactive():
        verbose, progress = 2, [_PlainProgressLogger(log_every)]
    model.fit(
        train_data,
        validation_data=eval_data,
        epochs=epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        validation_steps=eval_steps,
        shuffle=False,  # tf.data pipelines shuffle themselves
        callbacks=_callbacks(model_dir, history, monitor, _use_tensorboard(tensorboard), backup)
        + list(callbacks)
        + progress,
        verbose=verbose,
    )
    return TrainResult(model=model, history=read_history(model_dir), model_dir=model_dir)


def _build_for_backup(model, train_data):
    """Build ``model`` for the inputs of ``train_data``'s batches if it is not built yet
    (``BackupAndRestore`` refuses an unbuilt model, e.g. a ``Distiller``). Built from the
    dataset's ``element_spec``, not a batch: reading one would move a seeded shuffle on."""
    if model.built:
        return
    spec = train_data.element_spec
    inputs = spec[0] if isinstance(spec, tuple) else spec
    model.build(keras.tree.map_structure(lambda s: tuple(s.shape), inputs))
