"""``kp.GradualPruning`` in ``model.fit`` under the current Keras backend: prints one JSON line.

Usage: ``python gradual_fit.py [--mirrored] [--distiller] [--resume FOLDER] [--carry] [--taylor]``.
Builds a small functional CNN (batch norm, a residual add), plans ``params=0.5``, fits it a
few steps with the callback, finalizes, and reports what
``tests/test_gradual_backends.py`` checks against independent references:
the masked weights' values (on every replica), every kept weight's change,
Keras' ``count_params`` of the finalized model, the trainable weights the
rebuild dropped, and both models' outputs on one batch. ``--distiller``
runs it once more through ``keras.distillation.Distiller`` (its error, if
Keras' own distiller fails on this backend); ``--mirrored`` (TensorFlow)
trains under ``tf.distribute.MirroredStrategy`` over two logical CPUs, which
must be configured before TensorFlow starts, hence a script of its own.
``--resume FOLDER`` also interrupts a fit in the middle of the schedule and
resumes it with a new model and a new callback through
``keras.callbacks.BackupAndRestore`` (see :func:`resume`). ``--carry`` trains the
finalized model on with the optimizer's state carried over (see :func:`carry`);
``--taylor`` ranks channels by Taylor on two batches during the fit (see :func:`taylor`).
"""

import contextlib
import json
import sys
import traceback

import keras
import numpy as np

L = keras.layers
STEPS_PER_EPOCH = 4


def residual_cnn(seed=0):
    """Conv-BN-ReLU stem, one residual block (conv-BN-ReLU, conv-BN, add), pooling, a dense head."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = L.ReLU()(L.BatchNormalization(name="stem_bn")(
        L.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(inputs)))
    y = L.ReLU()(L.BatchNormalization(name="bn1")(L.Conv2D(12, 3, padding="same", name="c1")(x)))
    y = L.BatchNormalization(name="bn2")(L.Conv2D(16, 3, padding="same", name="c2")(y))
    x = L.ReLU()(L.Add()([x, y]))
    return keras.Model(inputs, L.Dense(5, name="fc")(L.GlobalAveragePooling2D()(x)))


def data(seed=0, batches=STEPS_PER_EPOCH, batch_size=8):
    """Random images and labels, ``batches`` batches of ``batch_size``."""
    rng = np.random.default_rng(seed)
    n = batches * batch_size
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.integers(0, 5, n)


def taylor():
    """Fits the residual CNN ranked by Taylor on two batches, its last update at its last step.

    Reports, besides :func:`report`, how many mask elements differ from those
    a one-shot Taylor ranking picks from the weights the fit ends with (the
    masked channels are zero, so they rank last and the same are picked):
    the gradients mid-fit were taken at the weights training had reached.
    The residual stream is tied (one width): with ``"prefix"`` its writers'
    masks keep the order of earlier updates, which a one-shot ranking of the
    final weights does not know.
    """
    import keras_precrop as kp
    from keras_precrop.graph.walker import walk
    from keras_precrop.planning import data_batches, planned_widths

    x, y = data()
    model = residual_cnn()
    plan = kp.plan(model, params=0.5, residual="tie")  # the stream keeps one order of its channels
    initial = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kp.GradualPruning(plan, end_step=2 * STEPS_PER_EPOCH, frequency=2, importance="taylor",
                                data=(x[:16], y[:16]), verbose=0)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[pruning], verbose=0)
    graph = walk(model, residual="tie")
    expected, _ = kp.gradual.channel_masks(graph, planned_widths(graph, plan, model),
                                           ("taylor", data_batches(model, (x[:16], y[:16]))))
    got = {w.path: m for w, m in pruning._masks}
    differ = sum(int(np.sum(got[w.path] != m)) if w.path in got else m.size for w, m in expected)
    return {**report(pruning, model, plan, initial, x), "taylor_masks_differ": differ,
            "taylor_masked_weights": [len(got), len(expected)]}


def _replicas(variable):
    """The values of ``variable`` on every device that holds a copy (one without a strategy)."""
    value = variable.value
    values = getattr(value, "values", None)  # a tf.distribute variable's copies (a tuple)
    if isinstance(values, tuple):
        return [np.asarray(v) for v in values]
    return [keras.ops.convert_to_numpy(value)]


def report(pruning, model, plan, initial, x):
    """What the test checks, from a fitted ``pruning`` callback and the ``model`` it pruned."""
    masks = {id(w): m for w, m in pruning._masks}
    masked_nonzero = kept_unchanged = masked = 0
    for w, before in zip(model.trainable_weights, initial, strict=True):
        mask = masks.get(id(w), np.ones(w.shape, np.float32))
        masked += int(mask.size - mask.sum())
        for value in _replicas(w):
            masked_nonzero += int(np.count_nonzero(value[mask == 0]))
            kept_unchanged += int(np.sum(value[mask == 1] == before[mask == 1]))
    small = pruning.finalize()
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return {
        "copies": len(_replicas(model.trainable_weights[0])),
        "steps": int(keras.ops.convert_to_numpy(pruning._fitted.optimizer.iterations)),
        "masked": masked, "masked_nonzero": masked_nonzero, "kept_unchanged": kept_unchanged,
        "trainable_dropped": trainable - sum(int(np.prod(w.shape)) for w in small.trainable_weights),
        "params": small.count_params(), "predicted": plan.predicted["params"],
        "original_params": model.count_params(),
        "masked_outputs": keras.ops.convert_to_numpy(model(x[:4], training=False)).tolist(),
        "final_outputs": keras.ops.convert_to_numpy(small(x[:4], training=False)).tolist(),
    }


def run(distiller=False, strategy=None):
    """Fits the residual CNN (or a Distiller with it as student) for 2 epochs with GradualPruning."""
    import keras_precrop as kp

    x, y = data()
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = residual_cnn()
        plan = kp.plan(model, params=0.5)
        initial = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
        fitted = model
        if distiller:
            fitted = keras.distillation.Distiller(
                teacher=residual_cnn(1), student=model,
                distillation_losses=keras.distillation.LogitsDistillation(temperature=4.0),
                student_loss_weight=0.5)
        fitted.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                       keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kp.GradualPruning(plan, end_step=4, frequency=2, verbose=0)
    fitted.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[pruning], verbose=0)
    return report(pruning, model, plan, initial, x)


class Interrupted(RuntimeError):
    """Raised by :class:`_InterruptAt`: the process "dies" in the middle of ``fit``."""


class _InterruptAt(keras.callbacks.Callback):
    """Raises :class:`Interrupted` once the optimizer has made ``step`` steps."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == self.step:
            raise Interrupted(f"interrupted at step {self.step}")


def _compiled(seed):
    """The residual CNN, compiled to run eagerly: three short fits trace nothing (what is tested
    is the callbacks' state across a restart, the same in a traced step)."""
    model = residual_cnn(seed)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    return model


def resume(folder, interrupt_at, end_step=10, frequency=3, pruning_first=False):
    """An uninterrupted fit and one interrupted at ``interrupt_at`` and resumed by a new model.

    Both fit 4 epochs of 4 unshuffled batches; the interrupted one backs up at
    every epoch's end (``BackupAndRestore``), and the resumed one, a new model
    with other initial weights and a new callback (as after a restart), is
    restored by ``BackupAndRestore`` listed before (or, ``pruning_first``,
    after) the pruning callback. The callbacks are given the model
    (``model=``), the path that, under JAX, once read emptied variables.
    Returns how the resumed model differs from the uninterrupted one.
    """
    import keras_precrop as kp

    x, y = data()
    runs = []
    for seed, stop in ((0, None), (0, interrupt_at), (1, None)):
        model = _compiled(seed)
        pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=end_step,
                                    frequency=frequency, model=model, verbose=0)
        callbacks = [pruning]
        if runs:  # the interrupted run and its resumption
            backup = keras.callbacks.BackupAndRestore(str(folder))
            callbacks = [pruning, backup] if pruning_first else [backup, pruning]
        try:
            model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0,
                      callbacks=callbacks + ([_InterruptAt(stop)] if stop else []))
        except Interrupted:
            continue
        runs.append((model, pruning))
    (reference, _), (resumed, pruning) = runs
    pairs = list(zip(reference.weights, resumed.weights, strict=True))
    value = keras.ops.convert_to_numpy
    return {
        "steps": [int(value(m.optimizer.iterations)) for m in (reference, resumed)],
        "zeros": int(sum(np.sum(value(a) == 0) for a, _ in pairs)),
        "zeros_differ": int(sum(np.sum((value(a) == 0) != (value(b) == 0)) for a, b in pairs)),
        "max_weight_diff": float(max(np.abs(value(a) - value(b)).max() for a, b in pairs)),
        "params": pruning.finalize().count_params(), "predicted": pruning.plan.predicted["params"],
    }


def carry():
    """Training on with the finalized model and the optimizer carried over, against the masked model.

    Reference: the masked model fitted 3 epochs (masks final at step 4), then finalized. Carried: fitted
    2 epochs, finalized, compiled with a fresh SGD, ``carry_optimizer``, fitted epoch 3. Returns how
    far their weights are apart and how many of the carried model's trainable weights epoch 3 left
    unchanged.
    """
    import keras_precrop as kp

    x, y = data()
    smalls = []
    for epochs in (3, 2):
        model = residual_cnn(0)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=4, frequency=2, verbose=0)
        model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, callbacks=[pruning], verbose=0)
        smalls.append(pruning.finalize())
    small = smalls[1]
    small.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning.carry_optimizer(small)
    before = [keras.ops.convert_to_numpy(w) for w in small.trainable_weights]
    small.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, shuffle=False, verbose=0)
    value = keras.ops.convert_to_numpy
    return {
        "max_weight_diff": float(max(np.abs(value(a) - value(b)).max()
                                     for a, b in zip(small.weights, smalls[0].weights, strict=True))),
        "unchanged": sum(bool(np.array_equal(value(w), b))
                         for w, b in zip(small.trainable_weights, before, strict=True)),
        "steps": int(value(small.optimizer.iterations)),
    }


def _two_cpu_strategy():
    """MirroredStrategy over two logical CPUs (configured before TensorFlow's runtime starts)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def main(argv):
    strategy = _two_cpu_strategy() if "--mirrored" in argv else None
    result = {"backend": keras.backend.backend(), "fit": run(strategy=strategy)}
    if strategy is not None:
        result["replicas"] = strategy.num_replicas_in_sync
    if "--resume" in argv:
        folder = argv[argv.index("--resume") + 1]
        result["resume"] = resume(folder, interrupt_at=7, pruning_first=True)
    if "--carry" in argv:
        result["carry"] = carry()
    if "--taylor" in argv:
        result["taylor"] = taylor()
    if "--distiller" in argv:
        try:
            result["distiller"] = run(distiller=True, strategy=strategy)
        except Exception as err:  # Keras' own Distiller on this backend: recorded, checked by the test
            result["distiller_error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()[-3000:]}"
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
