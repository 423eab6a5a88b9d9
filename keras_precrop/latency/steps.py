"""How the built-in runtimes run a model: the timed steps, and the LiteRT and ONNX conversions.

Each step builder takes ``(model, x, training)``, ``x`` the batch already on
the runtime's device, prepares the model (compiles, converts or exports it)
and returns a no-argument callable that launches one call on ``x`` and
returns its output without waiting for it (the runner waits, with the
device's ``wait``). The runtime table (:mod:`keras_precrop.latency.runtimes`)
names which builder each runtime uses.

The backend steps time the model's own computation, without
``predict_on_batch``'s per-call overhead (under JAX it cost about 30 ms per
call on resnet20, so a model 4x narrower timed at half the original's time
instead of a fifth, and every latency budget below that was infeasible).
"""

from __future__ import annotations

import os
import tempfile
import warnings

import keras
import numpy as np

from keras_precrop.errors import UnsupportedModelError
from keras_precrop.graph import trace as _trace

_CALIBRATION = 16  # random examples that calibrate an int8 model's activation ranges


def input_shape(model):
    """The one input shape of ``model`` (a subclassed model's: the one it was built with)."""
    specs = _trace.input_specs(model)
    if len(specs) != 1:
        raise ValueError(f"Model {model.name!r} has {len(specs)} inputs; latency "
                         "models time single-input models.")
    shape = tuple(specs[0][1][1:])
    if any(d is None for d in shape):
        raise ValueError(f"Model {model.name!r} has an undefined input shape {shape}; "
                         "timing needs a fixed one.")
    return shape


def _mean_square(y):
    """The loss of a timed training step: the outputs' mean square (any target would do)."""
    return keras.ops.mean(keras.ops.square(y))


def _sgd(model):
    """The timed training step's optimizer, built for ``model``: ``SGD(momentum=0.9)``."""
    optimizer = keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return optimizer


def tf_step(model, x, training):
    """A ``tf.function`` with a fixed input signature; the pass returns the outputs' sum
    (fetching it waits for the work; no output is skipped); the step is forward, loss,
    gradients and ``SGD(momentum=0.9).apply``, returning the loss."""
    import tensorflow as tf

    spec = tf.TensorSpec(x.shape, tf.float32)
    if not training:
        forward = tf.function(lambda inputs: tf.reduce_sum(model(inputs, training=False)),
                              input_signature=[spec])
        return lambda: forward(x)
    optimizer = _sgd(model)

    @tf.function(input_signature=[spec])
    def step(inputs):
        with tf.GradientTape() as tape:
            loss = _mean_square(model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda: step(x)


def jax_step(model, x, training):
    """``jax.jit`` of the model's ``stateless_call`` (and of a stateless SGD step)."""
    import jax

    state = [[v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables]]
    if not training:
        forward = jax.jit(lambda tv, ntv, inputs: model.stateless_call(tv, ntv, inputs)[0])
        return lambda: forward(*state, x)
    optimizer = _sgd(model)
    state.append([v.value for v in optimizer.variables])

    def loss(tv, ntv, inputs):
        y, ntv = model.stateless_call(tv, ntv, inputs, training=True)
        return _mean_square(y), ntv

    @jax.jit
    def step(tv, ntv, ov, inputs):
        (value, ntv), grads = jax.value_and_grad(loss, has_aux=True)(tv, ntv, inputs)
        tv, ov = optimizer.stateless_apply(ov, grads, tv)
        return tv, ntv, ov, value

    def run():
        tv, ntv, ov, value = step(*state, x)
        state[:] = [tv, ntv, ov]
        return value

    return run


def torch_step(model, x, training, compiled=False):
    """The model called eagerly on a torch tensor, or its module under ``torch.compile``
    (no gradients for inference; a backward pass and ``torch.optim.SGD(momentum=0.9)`` for
    training, eager only)."""
    import torch

    call = torch.compile(model) if compiled else model
    if not training:
        def forward():
            with torch.no_grad():
                return call(x, training=False)
        return forward
    optimizer = torch.optim.SGD([v.value for v in model.trainable_variables], lr=1e-3,
                                momentum=0.9)

    def step():
        optimizer.zero_grad()
        loss = _mean_square(model(x, training=True))
        loss.backward()
        optimizer.step()
        return loss

    return step


def to_tflite(model, batch_size=None, int8=False):
    """Convert a Keras model to a TFLite flatbuffer (bytes), weights frozen.

    The weights become constants of the graph (the converter freezes the
    function instead of saving it as a SavedModel first), as in a converted
    ``model.export()``: batch norm is folded into the convolutions, their
    activations fused, and the interpreter's XNNPACK delegate runs the whole
    graph as one partition. (The converter's default route for a function
    keeps Keras 3's weights as resource variables: every call then reads
    them, transposes each kernel and computes batch norm separately, and
    XNNPACK, which needs constant weights, is cut into one partition per
    layer; that ran resnet20 about 8x slower.)

    Args:
        model: a single-input Keras model; rebuilt models with
            ``ChannelSlice`` / ``PrefixAdd`` convert to builtin TFLite ops
            (``SLICE``, ``PAD``, ``ADD``).
        batch_size: fixed batch size of the converted graph (None: dynamic).
        int8: full-integer quantization (int8 weights, activations, input and
            output), activation ranges calibrated on random normal batches.
    """
    import tensorflow as tf

    spec = tf.TensorSpec((batch_size,) + input_shape(model), tf.float32)
    fn = tf.function(lambda x: model(x, training=False), input_signature=[spec])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()],
                                                                model)
    converter.experimental_lower_to_saved_model = False
    if int8:
        samples = _calibration_batches(model, batch_size or 1)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([batch] for batch in samples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return converter.convert()


def _calibration_batches(model, batch_size):
    """Random normal batches that calibrate an int8 model (timing needs ranges, not accuracy)."""
    rng = np.random.default_rng(1)
    count = max(1, _CALIBRATION // batch_size)
    return [rng.standard_normal((batch_size,) + input_shape(model)).astype("float32")
            for _ in range(count)]


def litert_step(model, x, training, int8=False):
    """A no-argument callable: one LiteRT interpreter invocation on ``x``, returning its output
    (read to the host, like ONNX Runtime's, so every runtime's runner returns the model's output);
    inference only (``training`` is False: the runtime table refuses a training step here),
    one interpreter thread per usable core.

    The flatbuffer is :func:`to_tflite`'s (weights frozen into constants);
    the interpreter is ``ai_edge_litert``'s where installed, else TensorFlow's
    ``tf.lite.Interpreter`` (the same runtime under its old name).
    """
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    with warnings.catch_warnings():  # tf.lite.Interpreter's deprecation notice
        warnings.simplefilter("ignore")
        interpreter = Interpreter(model_content=to_tflite(model, len(x), int8=int8),
                                  num_threads=_usable_cpus())
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    if int8:  # the input is int8 too: quantize the batch with the input's scale
        scale, zero = detail["quantization"]
        x = np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
    interpreter.set_tensor(detail["index"], x)
    output = interpreter.get_output_details()[0]["index"]

    def invoke():
        interpreter.invoke()
        return interpreter.get_tensor(output)

    return invoke


def to_onnx(model, path, int8=False):
    """Export ``model`` to an ONNX file at ``path`` with Keras' own exporter (``format="onnx"``).

    The exporter refuses a model that was never called (a freshly rebuilt
    one), so it is called once on zeros first. TensorFlow's exact GELU (a
    transformer's MLP) computes ``erfc``, which ``tf2onnx`` cannot convert
    (tensorflow-onnx #2463): it is converted as ``1 - Erf``. A constant tensor
    a layer keeps (keras_hub ViT's ``position_ids``) is exported as an extra
    graph input that no node reads but every caller would have to feed: it
    is dropped. With ``int8``, the export is
    quantized statically to int8 QDQ (per-channel weights, activation ranges
    calibrated on random normal examples) by ONNX Runtime's quantizer.
    """
    model(np.zeros((1,) + input_shape(model), "float32"), training=False)
    _convert_erfc()
    if not int8:
        model.export(str(path), format="onnx", verbose=False)
        _drop_captured_inputs(model, str(path))
        return path
    with tempfile.TemporaryDirectory() as folder:
        exported = os.path.join(folder, "float.onnx")
        model.export(exported, format="onnx", verbose=False)
        _drop_captured_inputs(model, exported)
        _quantize_onnx(model, exported, folder, str(path))
    return path


def _drop_captured_inputs(model, path):
    """Drop from the ONNX file at ``path`` the graph inputs that are not ``model``'s own and that
    no node reads: a constant tensor a layer holds (keras_hub ViT's ``position_ids``) captured by
    the traced function, whose readers tf2onnx folded into constants, yet which every caller
    would have to feed.

    Raises:
        UnsupportedModelError: such an input that a node does read (its value is not known here).
    """
    import onnx

    graph = onnx.load(path)
    initialized = {i.name for i in graph.graph.initializer}
    # the traced function's own inputs come first, its captures after them
    extra = [i for i in graph.graph.input if i.name not in initialized][len(model.inputs):]
    read = {name for node in graph.graph.node for name in node.input}
    if any(i.name in read for i in extra):
        raise UnsupportedModelError(
            f"Keras' ONNX export of model {model.name!r} reads inputs besides the model's own: "
            f"{[i.name for i in extra if i.name in read]} (tensors its layers hold, captured by "
            "the traced function); ONNX Runtime would need them fed.")
    if extra:
        for graph_input in extra:
            graph.graph.input.remove(graph_input)
        onnx.save(graph, path)


def _convert_erfc():
    """Teach ``tf2onnx`` TensorFlow's ``Erfc`` as ONNX's ``1 - Erf(x)`` (ONNX has no ``Erfc``;
    TensorFlow's GELU has used it since 2.16), unless it converts it already."""
    from tf2onnx import handler, utils

    if any("Erfc" in ops for ops in handler.tf_op.get_opsets().get("", [])):
        return

    class _Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):  # ONNX's Erf is in opset 9
            node.type = "Erf"
            one = ctx.make_const(utils.make_name("erfc_one"),
                                 np.array(1, utils.map_onnx_to_numpy_type(ctx.get_dtype(
                                     node.output[0]))))
            ctx.insert_new_node_on_output("Sub", node.output[0], inputs=[one.output[0],
                                                                         node.output[0]])

    handler.tf_op("Erfc")(_Erfc)


def _quantize_onnx(model, path, folder, quantized):
    """Writes a static int8 QDQ copy of the ONNX model at ``path`` to ``quantized``."""
    import onnxruntime
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class _Batches(q.CalibrationDataReader):
        def __init__(self, name):
            self.batches = iter({name: b} for b in _calibration_batches(model, 1))

        def get_next(self):
            return next(self.batches, None)

    name = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()[0].name
    prepared = os.path.join(folder, "prepared.onnx")
    quant_pre_process(path, prepared)
    q.quantize_static(prepared, quantized, _Batches(name), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
                      per_channel=True, calibrate_method=q.CalibrationMethod.MinMax)


def onnx_step(model, x, training, int8=False):
    """A no-argument callable: one ONNX Runtime session run on ``x`` (model exported by Keras;
    with ``int8``, statically quantized to int8 QDQ); inference only, as :func:`litert_step`."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = _usable_cpus()
    with tempfile.TemporaryDirectory() as folder:
        path = to_onnx(model, os.path.join(folder, "model.onnx"), int8=int8)
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feed)


def _usable_cpus():
    """The cores this process may run on: LiteRT and ONNX Runtime get one thread each."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
