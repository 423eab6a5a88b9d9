"""Fine-tuning a pruned model that kept its trained weights, alone or distilled from the original.

``fine_tune(student, data)`` trains with plain ``fit``; with ``teacher=``
the student also learns the teacher's softened outputs through
``keras.distillation.Distiller`` and ``LogitsDistillation``, which
``distiller(student, teacher)`` builds for a training loop of one's own
(``examples/_common.py`` compiles it with the paper's recipe). Facts of
Keras 3.15 shape it (docs/research/issue29_keep_weights.md):

* the default ``LogitsDistillation`` loss skips the softmax, so
  ``KLDivergence()`` is passed explicitly;
* ``Distiller`` freezes the teacher for good (``teacher.trainable = False``
  sets every layer's and variable's flag), so each flag is read before and
  set back after the call, a layer the user froze staying frozen; a student
  that shares the teacher's variables (which would be frozen too) is
  refused; a model that ``precrop(..., weights="keep")`` built owns its
  variables;
* ``LogitsDistillation`` takes outputs as logits, and the usual tutorial CNN
  ends in a softmax: a model whose last layer is a softmax (teacher and
  student apart) is distilled through ``log p``, which differs from its
  logits by a constant per example that the softened softmax ignores
  (``_SoftmaxDistillation``), and a softmax student's default loss reads
  probabilities.

The data is checked against the student first (``training/_user_data.py``:
arrays whole, other forms on their first batch), and a loss that turns NaN or
infinite stops the training with a ``LossNotFiniteError`` naming the epoch and
the batch (``_StopOnNaN``, Keras' ``TerminateOnNaN`` raising the package's
error), rather than a ``fit`` that returns weights that are no numbers.
"""
from __future__ import annotations

import math

import keras
import numpy as np

from keras_precrop.errors import NAME_ONLY, ArgumentError, LossNotFiniteError, is_integer, is_number
from keras_precrop.training._user_data import array_batches, check_data, outputs_probabilities
from keras_precrop.training.optimizers import SGDWithL2


def fine_tune(student, train_data, *, teacher=None, epochs=1, learning_rate=0.1,
              distill_temperature=4.0, alpha=0.5, loss=None, batch_size=None, steps_per_epoch=None,
              validation_data=None, weight_decay=0.0, callbacks=None, verbose="auto", initial_epoch=0,
              optimizer_from=None):
    """Train ``student`` in place for a few epochs, distilled or not.

    A model that ends in a softmax (``Dense(..., activation="softmax")``,
    a ``Softmax`` or ``Activation("softmax")`` layer: the usual tutorial
    CNN) is recognised, and trained as such: the default loss reads its
    outputs as probabilities, and the distillation softens the logarithms
    of the probabilities (logits up to a constant per example). This holds
    for the teacher and the student separately. Numbers may be NumPy
    scalars (``np.float32(0.1)``, ``np.int64(3)``), as Keras takes them;
    bools are refused.

    Args:
        student: the model to train (logits or softmax out), e.g. a pruned
            model with kept weights; it must have trainable weights. It is
            compiled here with this function's recipe (SGD with momentum
            0.9, ``loss``), replacing any optimizer and loss it was compiled
            with; to train with your own, call ``fit`` yourself.
        train_data: an ``(x, y)`` pair of arrays or anything ``fit`` takes
            as ``x`` (a ``tf.data.Dataset`` of ``(x, y)`` batches, a
            ``keras.utils.PyDataset``, a generator, ...). Its first batch is
            checked against ``student`` before training (input shape and
            dtype, finite values, labels that are class indices of its
            outputs or one-hot rows of their width; arrays are checked whole);
            labels may be left out only when distilling with ``alpha=0``.
        teacher: the original model (same output shape); None for plain
            fine-tuning. It does not train, and its layers' and variables'
            ``trainable`` flags are as they were after the call.
        epochs: epochs of training.
        learning_rate: SGD (momentum 0.9)'s starting rate, decayed linearly
            to 0 over the epochs when their steps are known (arrays, data
            with a ``len``, or ``steps_per_epoch``), else held. A rate
            "rewound" to the training recipe's peak recovers a heavily
            pruned model faster than a small one (CIFAR-10 ResNet-20: 0.1
            against 0.01, section "Pruning a trained model" of
            ``experiments/README.md``). A
            ``keras.optimizers.schedules.LearningRateSchedule`` is used as given.
        distill_temperature: the softmax temperature of the distillation.
        alpha: the weight of the supervised loss; ``1 - alpha`` goes to
            the distillation loss (``Distiller``'s ``student_loss_weight``).
        loss: the supervised loss; default cross-entropy of integer labels
            (sparse) or one-hot rows, from logits or from the probabilities
            of a softmax student. A loss of one's own turns off the check of
            the labels' classes.
        batch_size: with array data, a positive integer (``fit``'s default: 32).
        steps_per_epoch: batches per epoch, as for ``fit``; required for an
            infinite dataset.
        validation_data: as for ``fit``; checked as ``train_data`` is.
        verbose: as for ``fit``.
        weight_decay: coupled L2 on the conv/dense kernels (``SGDWithL2``,
            the training recipes' form: 1e-4 in CIFAR-10's); 0: none.
        callbacks: a callback or a list of them (None: none), passed to ``fit``,
            e.g. a :class:`~keras_precrop.GradualPruning` that prunes the
            student while it trains.
        initial_epoch: the epoch to start from, as for ``fit``: a second call
            that goes on with the model a first one pruned (``epochs`` counts
            both; pass both calls the same ``LearningRateSchedule``).
        optimizer_from: the :class:`~keras_precrop.GradualPruning` whose
            ``finalize()`` returned ``student``: the optimizer starts from the
            state of the one that fitted the masked model (its step count and
            momentum sliced to the kept channels, ``carry_optimizer``), so
            training goes on as it would have on the masked model, at the
            smaller model's cost.

    Returns:
        The ``History`` of ``fit``.

    Raises:
        ArgumentError: naming the argument at fault; ``DataError`` for data
            that does not fit ``student``; ``LossNotFiniteError`` (a
            ``DataError``) where the loss turns NaN or infinite, naming the
            epoch and the batch (``student``'s weights are then no numbers).
    """
    _check(student, teacher, epochs, learning_rate, distill_temperature, alpha)
    _check_resume(epochs, initial_epoch, optimizer_from)
    for name, value in (("batch_size", batch_size), ("steps_per_epoch", steps_per_epoch)):
        _check_count(name, value)
    if not (is_number(weight_decay) and (weight_decay == 0 or _positive(weight_decay))):
        raise ArgumentError("{weight_decay} must be a finite number >= 0.", weight_decay=weight_decay)
    callbacks = _callback_list(callbacks)
    checked = check_data(student, train_data, "train_data", labels=teacher is None or alpha > 0,
                         classes=loss is None, bound=("steps_per_epoch", steps_per_epoch),
                         batch_size=batch_size)
    if validation_data is not None:
        validation_data = check_data(student, validation_data, "validation_data",
                                     classes=loss is None, batch_size=batch_size).data
    loss = loss or _default_loss(checked.labels, outputs_probabilities(student, checked.inputs))
    x, y = checked.data if isinstance(checked.data, tuple) else (checked.data, None)
    steps = steps_per_epoch or _steps_per_epoch(x, batch_size)
    if steps and not isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        learning_rate = keras.optimizers.schedules.PolynomialDecay(
            float(learning_rate), int(epochs) * steps, 0.0)
    flags = _trainable_flags(teacher) if teacher is not None else []
    try:
        model = student if teacher is None else _distiller(
            student, teacher, distill_temperature, alpha, checked.inputs)
        model.compile(optimizer=SGDWithL2(float(weight_decay), learning_rate=learning_rate,
                                          momentum=0.9), loss=loss, metrics=["accuracy"])
        if optimizer_from is not None:
            _carry_optimizer(optimizer_from, model)
        return model.fit(x, y, batch_size=batch_size, epochs=int(epochs),
                         steps_per_epoch=steps_per_epoch, validation_data=validation_data,
                         callbacks=[_StopOnNaN(), *callbacks], verbose=verbose,
                         initial_epoch=int(initial_epoch), shuffle=_keras_shuffles(checked.data))
    finally:
        _restore_flags(flags)


def _callback_list(callbacks):
    """``callbacks`` as a list, as ``fit`` takes them: None, one callback, or an iterable of them."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        return [callbacks]
    listed = list(callbacks) if not isinstance(callbacks, (str, bytes)) and hasattr(
        callbacks, "__iter__") else None
    if listed is None or not all(isinstance(c, keras.callbacks.Callback) for c in listed):
        raise ArgumentError("{callbacks:subject} must be a keras.callbacks.Callback, a list of "
                            "them, or None{got}.", callbacks=callbacks)
    return listed


def _keras_shuffles(data):
    """``fit``'s ``shuffle=`` for ``data``: True where Keras shuffles it (arrays, a ``PyDataset``
    of known length), False for what shuffles itself or not at all (a ``tf.data.Dataset``, a
    generator, a ``DataLoader``), where Keras would only warn that ``shuffle=True`` is ignored."""
    if isinstance(data, keras.utils.PyDataset):
        return data.num_batches is not None
    return isinstance(data, tuple) or hasattr(data, "shape")


class _StopOnNaN(keras.callbacks.TerminateOnNaN):
    """Keras' ``TerminateOnNaN(raise_error=True)``, raising a :class:`LossNotFiniteError` that
    names the epoch and the batch (counted from 1, as ``fit`` prints them) and the data.

    Safe to run off the training thread (``async_safe``), as Keras runs it
    under JAX and PyTorch: it reads the logs and raises, nothing more; the
    error then surfaces in ``fit`` at the next batch or the epoch's end.
    """

    async_safe = True

    def __init__(self):
        super().__init__(raise_error=True)
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        """Notes the epoch, for the message."""
        self._epoch = epoch

    def on_batch_end(self, batch, logs=None):
        """``TerminateOnNaN``'s check of the loss, its error made a :class:`LossNotFiniteError`."""
        try:
            super().on_batch_end(batch, logs)
        except RuntimeError:  # Keras' own, for a NaN or infinite loss: said in the user's words
            raise LossNotFiniteError(
                f"{{train_data:=}} gave a loss of {logs['loss']} in epoch {self._epoch + 1}, by "
                f"batch {batch + 1}: training stopped, and the student's weights are no longer "
                "numbers. NaN or infinite values in the data (only the first batch of a dataset is "
                "checked before training) or too high a learning rate are the usual causes.",
                train_data=NAME_ONLY) from None


def _carry_optimizer(pruning, model):
    """``pruning.carry_optimizer(model)``, its refusals said as :func:`fine_tune`'s caller wrote
    the call: ``optimizer_from=`` and ``student=``, not a model or ``Distiller`` made here."""
    fitted = type(getattr(getattr(pruning, "model", None), "optimizer", None))
    if fitted not in (type(None), SGDWithL2):  # None: not fitted, which carry_optimizer says
        raise ArgumentError(
            f"{{optimizer_from:=}} fitted the masked model with {fitted.__name__}, and fine_tune "
            "trains with SGDWithL2 (momentum SGD, coupled L2): only an optimizer of the same class "
            "can take its state. Fit the masked model with kp.fine_tune too, or compile the "
            f"finalized model with {fitted.__name__} yourself and call "
            "optimizer_from.carry_optimizer(model).", optimizer_from=NAME_ONLY)
    try:
        pruning.carry_optimizer(model)
    except ArgumentError as err:
        if err.argument != "model":
            raise
        raise ArgumentError(
            "{student:=} must be the model that optimizer_from.finalize() returned (after the fit "
            "that pruned it): the optimizer's state is carried to that model's weights alone. "
            "Pass small = pruning.finalize() as fine_tune(small, ..., optimizer_from=pruning).",
            student=NAME_ONLY, optimizer_from=NAME_ONLY) from None


def accuracy(model, data, batch_size=32):
    """The share of ``data``'s examples whose label is ``model``'s top class (logits or softmax out).

    Read from calls in inference mode, not ``evaluate``: ``model`` need not be
    compiled (a pruned student may train on inside a ``Distiller``).

    Args:
        model: the classifier.
        data: ``(x, y)`` arrays, or batches of such pairs (a ``tf.data.Dataset``);
            labels are class indices or one-hot rows.
        batch_size: the batches that ``(x, y)`` arrays are read in.
    """
    if isinstance(data, tuple):
        data = array_batches(data, batch_size)
    correct = total = 0
    for x, y in data:
        y = np.asarray(y)
        labels = np.argmax(y, -1) if y.ndim > 1 and y.shape[-1] > 1 else y.reshape(-1)
        predicted = np.argmax(keras.ops.convert_to_numpy(model(np.asarray(x), training=False)), -1)
        correct, total = correct + int(np.sum(predicted == labels)), total + len(labels)
    return correct / total


def _default_loss(labels, probabilities):
    """Cross-entropy of ``labels`` (``"one-hot"`` rows, else class indices), from logits or from
    ``probabilities``."""
    kind = (keras.losses.CategoricalCrossentropy if labels == "one-hot"
            else keras.losses.SparseCategoricalCrossentropy)
    return kind(from_logits=not probabilities)


def _trainable_flags(model):
    """``(object, trainable)`` of every layer of ``model`` (itself first, each layer before its
    sublayers) and then of every variable: what ``model.trainable = ...`` overwrites."""
    layers = model._flatten_layers(include_self=True, recursive=True)  # Keras' own walk of them
    return [(layer, layer.trainable) for layer in layers] + [(v, v.trainable) for v in model.weights]


def _restore_flags(flags):
    """Sets each ``trainable`` back (layers before their sublayers, variables last)."""
    for obj, trainable in flags:
        obj.trainable = trainable


def _steps_per_epoch(x, batch_size):
    """Batches in one epoch of ``fit(x, batch_size=...)``; None when the data has no length."""
    try:
        n = len(x)
    except TypeError:  # a generator, or a dataset of unknown or infinite cardinality
        return None
    if hasattr(x, "shape"):  # an array of examples, batched by fit
        return math.ceil(n / (batch_size or 32))
    return n or None


def distiller(student, teacher, *, distill_temperature=4.0, alpha=0.5):
    """The ``keras.distillation.Distiller`` that :func:`fine_tune` trains with ``teacher=``.

    For a training loop of one's own (callbacks, a learning-rate schedule):
    compile it with the supervised loss and fit it; its ``student`` is the
    model being trained, and its metrics are the student's. It freezes
    ``teacher`` (``teacher.trainable = False``, every layer) for good.

    Args:
        student: the model to train (logits or softmax out).
        teacher: the original model (logits or softmax out, same output
            shape), with variables of its own: a student that shares them
            is refused.
        distill_temperature, alpha: as for :func:`fine_tune`.

    Returns:
        A ``Distiller`` with one ``LogitsDistillation`` (``KLDivergence``
        of the softened outputs) weighted ``1 - alpha``; where a model ends
        in a softmax, the logarithms of its probabilities are softened in
        place of its logits.
    """
    _check_distillation(student, teacher, distill_temperature, alpha)
    return _distiller(student, teacher, distill_temperature, alpha, None)


def _distiller(student, teacher, temperature, alpha, inputs):
    """:func:`distiller`'s ``Distiller``, each model's probabilities told from logits on ``inputs``
    (a batch) where its last layer cannot be read (NumPy scalars made Python numbers, which
    ``LogitsDistillation`` alone takes)."""
    temperature, alpha = float(temperature), float(alpha)
    kl = keras.losses.KLDivergence()  # the default loss skips the softmax (module docstring)
    flags = outputs_probabilities(teacher, inputs), outputs_probabilities(student, inputs)
    loss = (_SoftmaxDistillation(temperature, kl, *flags) if any(flags)
            else keras.distillation.LogitsDistillation(temperature=temperature, loss=kl))
    return keras.distillation.Distiller(teacher=teacher, student=student,
                                        student_loss_weight=alpha, distillation_losses=loss)


@keras.saving.register_keras_serializable(package="keras_precrop", name="SoftmaxDistillation")
class _SoftmaxDistillation(keras.distillation.LogitsDistillation):
    """``LogitsDistillation`` where the teacher, the student or both output probabilities.

    ``log p`` stands in for such a model's logits: it differs from them by
    a constant per example, which a softmax ignores, so ``softmax(log p /
    T)`` is the distribution the logits would give at temperature ``T``
    (and ``T = 1`` gives ``p`` back).
    """

    def __init__(self, temperature=3.0, loss="kl_divergence", teacher_probabilities=False,
                 student_probabilities=False):
        super().__init__(temperature=temperature, loss=loss)
        self.teacher_probabilities = teacher_probabilities
        self.student_probabilities = student_probabilities

    def compute_loss(self, teacher_outputs, student_outputs, **kwargs):
        """``LogitsDistillation``'s loss of the two models' logits (``log p`` for probabilities)."""
        return super().compute_loss(_logits(teacher_outputs, self.teacher_probabilities),
                                    _logits(student_outputs, self.student_probabilities), **kwargs)

    def get_config(self):
        """The configuration, with which outputs are probabilities."""
        return {**super().get_config(), "teacher_probabilities": self.teacher_probabilities,
                "student_probabilities": self.student_probabilities}


def _logits(outputs, probabilities):
    """``outputs``, or ``log`` of them where they are ``probabilities`` (clipped away from 0,
    as Keras' cross-entropy of probabilities does)."""
    if not probabilities:
        return outputs
    return keras.ops.log(keras.ops.clip(outputs, keras.config.epsilon(), 1.0))


def _check_count(name, value):
    """Refuses ``value`` unless it is None or a positive integer (``True`` is not one)."""
    if value is not None and (not is_integer(value) or value < 1):
        raise ArgumentError(f"{{{name}:subject}} must be a positive integer{{got}}",
                            **{name: value})


def _check(student, teacher, epochs, learning_rate, temperature, alpha):
    """Checks :func:`fine_tune`'s arguments, naming the one at fault."""
    schedule = isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule)
    if not schedule and not _positive(learning_rate):
        raise ArgumentError("{learning_rate} must be a positive number or a LearningRateSchedule.",
                            learning_rate=learning_rate)
    if not is_integer(epochs) or epochs < 1:
        raise ArgumentError("{epochs} must be a positive integer.", epochs=epochs)
    _check_distillation(student, teacher, temperature, alpha)
    if not student.trainable_weights:
        raise ArgumentError(
            "{student:=} has no trainable weights (student.trainable is False, or every layer of it "
            "is frozen), so fine_tune would train nothing. Set student.trainable = True, or unfreeze "
            "the layers to train.", student=NAME_ONLY)


def _check_resume(epochs, initial_epoch, optimizer_from):
    """Checks where :func:`fine_tune` starts from, naming the argument at fault."""
    if not is_integer(initial_epoch) or not 0 <= initial_epoch < epochs:
        raise ArgumentError(f"{{initial_epoch}} must be an integer in [0, epochs={epochs}).",
                            initial_epoch=initial_epoch)
    if optimizer_from is not None and not callable(getattr(optimizer_from, "carry_optimizer", None)):
        raise ArgumentError("{optimizer_from} must be the kp.GradualPruning whose finalize() returned "
                            "the student.", optimizer_from=optimizer_from)


def _check_distillation(student, teacher, temperature, alpha):
    """Checks the distillation's arguments (``teacher`` None: only the numbers), naming the one at fault."""
    if not _positive(temperature):
        raise ArgumentError("{distill_temperature} must be a positive number.",
                            distill_temperature=temperature)
    if not (is_number(alpha) and 0 <= alpha <= 1):
        raise ArgumentError("{alpha} must be a weight in [0, 1].", alpha=alpha)
    if teacher is None:
        return
    if not isinstance(teacher, keras.Model):
        raise ArgumentError("{teacher:subject} must be a keras.Model, the trained model to distil "
                            "from (e.g. the model that was pruned){got}.", teacher=teacher)
    shapes = _output_shapes(teacher), _output_shapes(student)
    if None not in shapes and shapes[0] != shapes[1]:
        raise ArgumentError(
            f"{{teacher:=}} has outputs of shape {shapes[0]}, the student {shapes[1]}: "
            "distillation matches the student's outputs to the teacher's, so they must have "
            "the same shapes (the teacher is the model the student was pruned from).",
            teacher=NAME_ONLY)
    shared = {id(w) for w in teacher.weights} & {id(w) for w in student.weights}
    if shared:
        raise ArgumentError(
            "{teacher:=} and the student share variables; distillation freezes the teacher, "
            "and with it the student. Give the student its own weights "
            "(kp.precrop(..., weights='keep') builds such a model).")


def _output_shapes(model):
    """``model``'s output shape(s) without the batch dimension, or ``None`` where Keras knows none."""
    try:
        shapes = model.output_shape
    except (AttributeError, ValueError):  # a subclassed model: no symbolic outputs
        return None
    if isinstance(shapes, dict):
        return {name: tuple(shape)[1:] for name, shape in shapes.items()}
    if isinstance(shapes, list):
        return [tuple(shape)[1:] for shape in shapes]
    return tuple(shapes)[1:]


def _positive(value):
    """Whether ``value`` is a finite positive number (a NumPy scalar too; ``True`` is not one)."""
    return is_number(value) and math.isfinite(value) and value > 0
