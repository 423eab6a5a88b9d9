"""Fine-tuning a pruned model that kept its trained weights, alone or distilled from the original.

``fine_tune(student, data)`` trains with plain ``fit``; with ``teacher=``
the student also learns the teacher's softened outputs through
``keras.distillation.Distiller`` and ``LogitsDistillation``, which
``distiller(student, teacher)`` builds for a training loop of one's own
(``examples/_common.py`` compiles it with the paper's recipe). Two facts of
Keras 3.15 shape it (docs/research/issue29_keep_weights.md): the default
``LogitsDistillation`` loss skips the softmax, so ``KLDivergence()`` is
passed explicitly, and ``Distiller`` freezes the teacher for good, so the
teacher's ``trainable`` is restored afterwards and a student that shares its
variables (which would be frozen too) is refused. A model that
``precrop(..., weights="keep")`` built owns its variables.
"""

from __future__ import annotations

import math

import keras

from keras_precrop.errors import ArgumentError


def fine_tune(student, train_data, *, teacher=None, epochs=1, learning_rate=0.1,
              distill_temperature=4.0, alpha=0.5, loss=None, batch_size=None,
              validation_data=None, verbose="auto"):
    """Train ``student`` in place for a few epochs, distilled or not.

    Args:
        student: the model to train (its outputs are logits unless ``loss``
            says otherwise), e.g. a pruned model with kept weights.
        train_data: an ``(x, y)`` pair of arrays or anything ``fit`` takes
            as ``x`` (a ``tf.data.Dataset`` of ``(x, y)`` batches, a
            ``keras.utils.PyDataset``, ...).
        teacher: the original model (logits out, same output shape); None
            for plain fine-tuning.
        epochs: epochs of training.
        learning_rate: SGD (momentum 0.9)'s starting rate, decayed linearly
            to 0 over the epochs when their steps are known (arrays, or data
            with a ``len``), else held. A rate "rewound" to the training
            recipe's peak recovers a heavily pruned model faster than a small
            one (CIFAR-10 ResNet-20: 0.1 against 0.01, section "Pruning a
            trained model" of ``experiments/README.md``). A
            ``keras.optimizers.schedules.LearningRateSchedule`` is used as given.
        distill_temperature: the softmax temperature of the distillation.
        alpha: the weight of the supervised loss; ``1 - alpha`` goes to
            the distillation loss (``Distiller``'s ``student_loss_weight``).
        loss: the supervised loss; default sparse categorical cross-entropy
            from logits.
        batch_size: with array data (``fit``'s default: 32).
        validation_data, verbose: as for ``fit``.

    Returns:
        The ``History`` of ``fit``.
    """
    _check(student, teacher, epochs, learning_rate, distill_temperature, alpha)
    loss = loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = train_data if isinstance(train_data, tuple) else (train_data, None)
    model, frozen = student, None
    if teacher is not None:
        frozen = teacher.trainable
        model = distiller(student, teacher, distill_temperature=distill_temperature, alpha=alpha)
    steps = _steps_per_epoch(x, batch_size)
    if steps and not isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        learning_rate = keras.optimizers.schedules.PolynomialDecay(learning_rate, epochs * steps, 0.0)
    try:
        model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9), loss=loss,
                      metrics=["accuracy"])
        return model.fit(x, y, batch_size=batch_size, epochs=epochs,
                         validation_data=validation_data, verbose=verbose)
    finally:
        if teacher is not None:
            teacher.trainable = frozen


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
    ``teacher`` (``trainable = False``) for good.

    Args:
        student: the model to train (logits out).
        teacher: the original model (logits out, same output shape), with
            variables of its own: a student that shares them is refused.
        distill_temperature, alpha: as for :func:`fine_tune`.

    Returns:
        A ``Distiller`` with one ``LogitsDistillation`` (``KLDivergence``
        of the softened outputs) weighted ``1 - alpha``.
    """
    _check_distillation(student, teacher, distill_temperature, alpha)
    return keras.distillation.Distiller(
        teacher=teacher, student=student, student_loss_weight=alpha,
        distillation_losses=keras.distillation.LogitsDistillation(
            temperature=distill_temperature, loss=keras.losses.KLDivergence()))


def _check(student, teacher, epochs, learning_rate, temperature, alpha):
    """Checks :func:`fine_tune`'s arguments, naming the one at fault."""
    schedule = isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule)
    if not schedule and not _positive(learning_rate):
        raise ArgumentError("{learning_rate} must be a positive number or a LearningRateSchedule.",
                            learning_rate=learning_rate)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ArgumentError("{epochs} must be a positive integer.", epochs=epochs)
    if teacher is None:  # with a teacher, distiller() checks them as it builds the Distiller
        _check_distillation(student, None, temperature, alpha)


def _check_distillation(student, teacher, temperature, alpha):
    """Checks the distillation's arguments (``teacher`` None: only the numbers), naming the one at fault."""
    if not _positive(temperature):
        raise ArgumentError("{distill_temperature} must be a positive number.",
                            distill_temperature=temperature)
    if not (isinstance(alpha, (int, float)) and 0 <= alpha <= 1):
        raise ArgumentError("{alpha} must be a weight in [0, 1].", alpha=alpha)
    if teacher is not None:
        shared = {id(w) for w in teacher.weights} & {id(w) for w in student.weights}
        if shared:
            raise ArgumentError(
                "{teacher:=} and the student share variables; distillation freezes the teacher, "
                "and with it the student. Give the student its own weights "
                "(kp.precrop(..., weights='keep') builds such a model).")


def _positive(value):
    """Whether ``value`` is a finite positive number (``True`` is not one, though Python counts it 1)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)
