"""How channels flow through each layer class: the handler registry.

This is the one table of layer classes. A handler describes its layer class
for every part of the package: while the graph is walked it maps input
channel descriptors to output descriptors and declares the layer's bilinear
cost terms (``walk``); when the model is rebuilt it rewrites the layer's
config for new widths (``configure``), or re-creates a ``keras.ops``
operation whose arguments name channels (``rebuild_op``); for the pruning
baselines it names the layer's maskable weights (``weight_specs``) and which
input channel each output channel comes from (``channel_map``). Handlers are looked up along the
layer class's MRO, so subclasses of built-in layers inherit their rule;
``register_handler`` teaches the package a custom layer.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
from keras import layers as L
from keras import ops
from keras.src.activations import activations as _activations
from keras.src.ops import core as _ops_core
from keras.src.ops import image as _ops_image
from keras.src.ops import nn as _ops_nn
from keras.src.ops import numpy as _ops_np

from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph import layers as _custom
from keras_precrop.graph.attention import MultiHeadAttention
from keras_precrop.graph.backend_macs import measured_macs
from keras_precrop.graph.channels import (
    Part,
    channels_width,
    input_shape,
    output_shape,
    width_of,
)
from keras_precrop.graph.einsum import EinsumDense
from keras_precrop.graph.embedding import VIT_EMBEDDINGS, ReversibleEmbedding, TokenEmbedding
from keras_precrop.graph.gqa import GroupedQueryAttention
from keras_precrop.graph.handler_base import (
    BIAS,
    Handler,
    WeightSpec,
    const_weights,
    elementwise_map,
    op_weights,
)
from keras_precrop.graph.shape_handlers import (
    Flatten,
    OpAxes,
    OpGetItem,
    OpPad,
    OpReshape,
    OpSplit,
    Reshape,
    Slice,
)

__all__ = ["OPAQUE", "Handler", "WeightSpec", "handler_of", "lookup", "register_handler"]


class Tie(Handler):
    """Output channels are the input channels (BN, activations, pooling, ...).

    Weights whose last axis is the channel axis (BN's gamma and statistics,
    LayerNorm's gamma, PReLU's alpha) scale with the width; others are
    constants.

    Args:
        width_key: the config entry that holds the layer's channel count, for
            layers that create their per-channel weights from it rather than
            from the input's shape (ConvNeXt's ``LayerScale`` has
            ``projection_dim``, keras_hub's ``RmsNorm2d`` ``dim``); the
            rebuild sets it to the new width.
    """

    def __init__(self, width_key=None):
        self.width_key = width_key

    def configure(self, rec, config, width):
        if self.width_key is not None:
            config[self.width_key] = channels_width(rec.inputs[0][0], width)
        return config

    def walk(self, ctx, rec, node, ins):
        if getattr(rec.layer, "data_format", None) == "channels_first":
            raise UnsupportedLayerError(f"{rec.path}: only channels_last layers are supported.")
        channels, masks = ins[0], _mask_arguments(node)
        for i, other in enumerate(ins[1:], 1):
            if i in masks:  # a Keras mask (GlobalAveragePooling1D's): its last axis is positions
                ctx.fix(other)
            else:
                ctx.tie(channels, other, rec.path)
        total = width_of(ctx, channels)
        per_channel = _acts_on_channels(rec.layer, len(input_shape(node)))
        for w in op_weights(rec.layer):
            shape = tuple(w.shape)
            size = math.prod(shape)
            if per_channel and shape and shape[-1] == total:
                for p in channels:
                    ctx.add_term(rec, size // total, 0, p)
            else:
                ctx.add_term(rec, size, 0)
        return [channels] * len(node.outputs)

    def channel_map(self, rec, node):
        return elementwise_map(node)

    def channel_axes(self, rec, node):
        """The last axis of every float weight that follows the channels (gamma, statistics, ...)."""
        shape = input_shape(node)
        per_channel = _acts_on_channels(rec.layer, len(shape))
        return [{-1: "out"} if per_channel and tuple(w.shape)[-1:] == shape[-1:]
                and "float" in str(w.dtype) else {} for w in op_weights(rec.layer)]


def _mask_arguments(node):
    """The indices (in the call's tensor arguments) of the tensors passed as ``mask=``: Keras
    hands a layer whose ``call`` takes ``mask`` the mask of its input (``mask_zero`` embeddings)."""
    mask = node.arguments.kwargs.get("mask")
    ids = {id(t) for t in keras.tree.flatten(mask) if isinstance(t, keras.KerasTensor)}
    return {i for i, t in enumerate(node.arguments.keras_tensors) if id(t) in ids}


class BatchNorm(Tie):
    """BatchNormalization: tied channels; gamma and beta are maskable."""

    weight_specs = {"gamma": WeightSpec("gamma_constraint", "scale"),
                    "beta": WeightSpec("beta_constraint", "bias")}


# Lambdas of optional libraries that equal a named Keras activation, by qualified
# name: keras_hub's MobileNetV5 ``ConvNormAct`` builds
# ``Activation(lambda x: keras.activations.gelu(x, approximate=False))``, which is
# ``"gelu"`` (its default is ``approximate=False``).
_NAMED_LAMBDAS = {
    "keras_hub.src.models.mobilenetv5.mobilenetv5_layers.ConvNormAct.__init__.<locals>.<lambda>":
        "gelu",
}


class Activation(Tie):
    """``keras.layers.Activation``: tied channels; the rebuild reuses its function.

    The function object itself goes to the new layer, so a lambda needs no
    deserialization. Keras 3.15 cannot load an ``Activation`` holding a
    lambda from a ``.keras`` file, so a lambda known to equal a named
    activation (``_NAMED_LAMBDAS``) is rebuilt as that name.
    """

    def configure(self, rec, config, width):
        fn = rec.layer.activation
        name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
        return {**config, "activation": _NAMED_LAMBDAS.get(name, fn)}


class Normalize(Tie):
    """LayerNormalization, UnitNormalization, Softmax: act along ``axis``.

    When ``axis`` includes the channel axis, every output channel depends on
    every input channel.
    """

    def channel_map(self, rec, node):
        if _acts_on_channels(rec.layer, len(input_shape(node))):
            return None
        return elementwise_map(node)

    def mixes_statistics(self, rec, node):
        return _acts_on_channels(rec.layer, len(input_shape(node)))

    def masked_call(self, rec):
        """``rec.layer``'s computation with its statistics over the channels a model's masks keep.

        A model whose cut channels are masked, not yet removed (``GradualPruning``
        during ``fit``), computes what the rebuilt one does only if a layer that
        normalizes over the channels leaves the masked ones out of its mean and
        variance: a masked channel is zero but would still count. Returns
        ``call(inputs, keep)`` (``keep``: 0/1 per channel of the last axis), which
        computes the layer as rebuilt to the kept channels, and zero at the
        others; ``None`` for a class whose own ``call`` it does not know (a
        softmax, a unit or group norm, a subclass that overrides ``call``).
        """
        layer = rec.layer
        for cls, masked in _MASKED_NORMS:
            if type(layer).call is cls.call:
                return lambda inputs, keep: masked(layer, inputs, keep)
        return None


def _masked_inputs(layer, inputs, keep):
    """The inputs in at least float32 (as Keras' norms compute), ``keep`` as a tensor of their
    dtype, the axes normalized over (sorted, non-negative) and how many kept entries they hold."""
    x = ops.convert_to_tensor(inputs)
    x = ops.cast(x, keras.backend.result_type(x.dtype, "float32"))
    k = ops.cast(keep, x.dtype)
    rank = len(x.shape)
    axes = sorted(a % rank for a in ([layer.axis] if isinstance(layer.axis, int) else layer.axis))
    count = (ops.sum(k) if axes == [rank - 1]
             else ops.sum(ops.ones_like(x) * k, axis=axes, keepdims=True))
    return x, k, axes, count


def _along(weight, x, axes):
    """A norm's weight (``None`` for none) in ``x``'s dtype, shaped to broadcast over ``x``'s axes."""
    if weight is None:
        return None
    shape = [x.shape[a] if a in axes else 1 for a in range(len(x.shape))]
    return ops.reshape(ops.cast(weight, x.dtype), shape)


def _epsilon(layer):
    """The norm's ``epsilon``, or Keras' default where it is ``None`` (as its ``call`` takes it)."""
    return keras.backend.epsilon() if layer.epsilon is None else layer.epsilon


def _masked_layer_normalization(layer, inputs, keep):
    """``keras.layers.LayerNormalization.call`` over the kept channels (``center``, ``scale``,
    and the deprecated ``rms_scaling``: the inputs, not centered, over the kept deviation)."""
    x, k, axes, count = _masked_inputs(layer, inputs, keep)
    mean = ops.sum(x * k, axis=axes, keepdims=True) / count
    centered = (x - mean) * k
    inv = ops.rsqrt(ops.sum(ops.square(centered), axis=axes, keepdims=True) / count
                    + _epsilon(layer))
    gamma, beta = _along(layer.gamma, x, axes), _along(layer.beta, x, axes)
    out = (x * k if layer.rms_scaling else centered) * inv
    if gamma is not None:
        out = out * gamma
    if beta is not None and not layer.rms_scaling:
        out = out + beta * k
    return ops.cast(out, layer.compute_dtype)


def _masked_rms_normalization(layer, inputs, keep):
    """``keras.layers.RMSNormalization.call`` over the kept channels: ``x / rms(kept x) * scale``."""
    x, k, axes, count = _masked_inputs(layer, inputs, keep)
    kept = x * k
    rrms = ops.rsqrt(ops.sum(ops.square(kept), axis=axes, keepdims=True) / count + _epsilon(layer))
    return ops.cast(kept * rrms * _along(layer.scale, x, axes),
                    keras.backend.standardize_dtype(inputs.dtype))


# The norms whose statistics ``Normalize.masked_call`` computes over kept channels, by class.
_MASKED_NORMS = ((L.LayerNormalization, _masked_layer_normalization),
                 (L.RMSNormalization, _masked_rms_normalization))


def _acts_on_channels(layer, rank):
    """Whether a layer's weights follow the channel axis (its ``axis`` says)."""
    axis = getattr(layer, "axis", None)
    if axis is None:
        return True
    axes = [axis] if isinstance(axis, int) else list(axis)
    return any(a % rank == rank - 1 for a in axes)


class Fixed(Handler):
    """An opaque block: its channels never change and its cost is constant.

    Its parameters are its weights; its MACs are what the backend counts in
    one call on inputs of the recorded shapes (``backend_macs``). When the
    backend cannot count them, ``rec.macs_unknown`` is set and the budgets
    that count MACs or time refuse the model, naming the layer.

    An output whose channel (last) axis has no size in the graph (a layer
    whose ``compute_output_shape`` or symbolic ``call`` leaves it ``None``)
    is refused by name: its channels would be fixed at a width nobody knows,
    and keeping the layer whole is then no remedy.
    """

    ties_shared_inputs = False  # every call's inputs are fixed

    def walk(self, ctx, rec, node, ins):
        for t in node.outputs:
            if t.shape[-1] is None:
                raise UnsupportedLayerError(
                    f"Layer {rec.path!r} of class {type(rec.layer).__name__} outputs a tensor "
                    f"of shape {tuple(t.shape)}, whose channel (last) axis has no size: a block "
                    "kept whole keeps its channels at a fixed width, and this width is unknown. "
                    "Give the layer a compute_output_shape() that returns that size (inside "
                    "a composite layer: keep the composite whole with ignore=[its name]).")
        for ch in ins:
            ctx.fix(ch)
        const_weights(ctx, rec)
        macs = measured_macs(rec.layer, node, ctx.concrete)
        if macs is None:
            if not rec.macs_unknown:
                ctx.note(f"{rec.path}: its MACs are unknown (the backend cannot count them); "
                         "they are left out of the total, and MAC and latency budgets are refused.")
            rec.macs_unknown = True
        elif macs:
            ctx.add_term(rec, 0, macs)
        outs = []
        for i, t in enumerate(node.outputs):
            seg = ctx.new_segment(t.shape[-1], f"{rec.path}:{i}", fixed=True)
            outs.append((Part(seg),))
        return outs


class _Source(Handler):
    """A layer that creates new output channels (its ``width_key`` config)."""

    width_key = "filters"

    def _out(self, ctx, rec):
        """The channels the layer creates."""
        return ctx.new_output(rec, rec.layer.get_config()[self.width_key])

    def configure(self, rec, config, width):
        config[self.width_key] = width(rec.out_segment)
        return config


class Conv(_Source):
    """Conv1D/2D/3D: ``k * c_in * c_out / groups`` weights, MACs per output pixel.

    A grouped convolution with one input channel per group (``groups ==
    c_in``, ConvNeXt's depthwise convs) is a depthwise conv: its output
    (``filters / groups`` channels per input channel) follows its input's
    width. Any other ``groups = g`` keeps ``g`` groups and changes the
    channels per group, so its input and output widths move in multiples of
    ``g`` (ResNeXt, RegNet).
    """

    transpose = False
    weight_specs = {"kernel": WeightSpec("kernel_constraint", "kernel", -2, -1), **BIAS}

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            raise UnsupportedLayerError(
                f"{rec.path}: only channels_last convolutions are supported."
            )
        groups = getattr(layer, "groups", 1)
        if _depthwise_groups(layer, width_of(ctx, ins[0])):
            return [_depthwise(ctx, rec, node, ins[0], layer.filters // groups, layer.use_bias)]
        out = self._out(ctx, rec)
        if groups > 1:
            ctx.multiple_of(rec, ins[0], groups)
            ctx.multiple_of(rec, out, groups)
        kernel = math.prod(layer.kernel_size) / groups
        spatial_shape = input_shape(node) if self.transpose else output_shape(node)
        pixels = math.prod(spatial_shape[1:-1])
        ctx.add_kernel(rec, ins[0], out, params=kernel, macs=kernel * pixels, bias=layer.use_bias)
        return [out]

    def configure(self, rec, config, width):
        groups = config.get("groups", 1)
        if groups > 1 and rec.out_segment is None:  # depthwise: follows its input
            channels = channels_width(rec.inputs[0][0], width)
            config["filters"] = config["filters"] // groups * channels
            config["groups"] = channels
            return config
        return super().configure(rec, config, width)

    def specs_of(self, layer):
        groups = getattr(layer, "groups", 1)
        return {name: dataclasses.replace(spec, groups=groups) if spec.kind == "kernel" else spec
                for name, spec in self.weight_specs.items()}

    def channel_map(self, rec, node):
        channels = input_shape(node)[-1]
        if _depthwise_groups(rec.layer, channels):
            return [np.repeat(np.arange(channels), rec.layer.filters // channels)]
        return None

    def channel_axes(self, rec, node):
        if _depthwise_groups(rec.layer, input_shape(node)[-1]):  # kernel (..., 1, filters)
            return [{-1: "out"} for _ in rec.layer.weights]
        return super().channel_axes(rec, node)


def _depthwise_groups(layer, channels):
    """Whether a grouped conv has one input channel per group (a depthwise conv)."""
    groups = getattr(layer, "groups", 1)
    return groups > 1 and groups == channels


class ConvTranspose(Conv):
    """Conv*Transpose: MACs per *input* pixel; kernels are ``(..., out, in)``."""

    transpose = True
    weight_specs = {"kernel": WeightSpec("kernel_constraint", "kernel", -1, -2), **BIAS}


class Dense(_Source):
    """Dense on the last axis; leading axes (beyond batch) multiply MACs."""

    width_key = "units"

    weight_specs = {"kernel": WeightSpec("kernel_constraint", "kernel", 0, 1), **BIAS}

    def walk(self, ctx, rec, node, ins):
        out = self._out(ctx, rec)
        rows = math.prod(input_shape(node)[1:-1])
        ctx.add_kernel(rec, ins[0], out, params=1, macs=rows, bias=rec.layer.use_bias)
        return [out]


def _depthwise(ctx, rec, node, channels, multiplier, bias):
    """Declare a layer's depthwise kernel on ``channels``; returns its output channels.

    Each input channel gets ``multiplier`` output channels.
    """
    layer = rec.layer
    out = tuple(Part(p.segment, p.mult * multiplier) for p in channels)
    kernel = math.prod(layer.kernel_size)
    pixels = math.prod(output_shape(node)[1:-1])
    ctx.add_kernel(rec, out, params=kernel, macs=kernel * pixels, bias=bias)
    return out


class Depthwise(Handler):
    """DepthwiseConv: output channels are ``depth_multiplier`` x input's."""

    def walk(self, ctx, rec, node, ins):
        return [_depthwise(ctx, rec, node, ins[0], rec.layer.depth_multiplier, rec.layer.use_bias)]

    weight_specs = {"kernel": WeightSpec("depthwise_constraint", "depthwise", -2, -1), **BIAS}

    def channel_map(self, rec, node):
        channels = input_shape(node)[-1]
        return [np.repeat(np.arange(channels), rec.layer.depth_multiplier)]


class Separable(_Source):
    """SeparableConv: a depthwise kernel then a pointwise one."""

    weight_specs = {"depthwise_kernel": WeightSpec("depthwise_constraint", "depthwise", -2, -1),
                    "pointwise_kernel": WeightSpec("pointwise_constraint", "kernel", -2, -1),
                    **BIAS}

    def channel_axes(self, rec, node):
        axes = super().channel_axes(rec, node)
        for w, roles in zip(rec.layer.weights, axes):
            if w.name == "pointwise_kernel":
                roles[-2] = "mid"
        return axes

    def walk(self, ctx, rec, node, ins):
        out = self._out(ctx, rec)
        mid = _depthwise(ctx, rec, node, ins[0], rec.layer.depth_multiplier, False)
        pixels = math.prod(output_shape(node)[1:-1])
        ctx.add_kernel(rec, mid, out, params=1, macs=pixels, bias=rec.layer.use_bias)
        return [out]


class Merge(Handler):
    """Add: a residual stream (prefix or tied, resolved in ``graph.py``)."""

    def walk(self, ctx, rec, node, ins):
        const_weights(ctx, rec)
        if any(len(ch) != 1 or ch[0].mult != 1 for ch in ins):
            return _broadcast(ctx, rec, node, ins)
        width = max(width_of(ctx, ch) for ch in ins)
        seg = ctx.new_segment(width, rec.path)
        ctx.merge(rec, seg, [ch[0].segment for ch in ins])
        return [(Part(seg),)]

    def channel_map(self, rec, node):
        return elementwise_map(node)


def _broadcast(ctx, rec, node, ins):
    """Couple the channel axes of element-wise inputs, broadcast-aware."""
    tensors = node.arguments.keras_tensors
    wide = [ch for ch, t in zip(ins, tensors) if t.shape[-1] != 1]
    if not wide:
        return [ins[0]]
    for other in wide[1:]:
        ctx.tie(wide[0], other, rec.path)
    return [wide[0]]


class Broadcast(Handler):
    """Subtract/Multiply/Average/Max/Min and element-wise ops: tie channels.

    A ``[B, 1, 1, C]`` gate (squeeze-excite) is tied to the features on the
    channel axis only; a size-1 channel axis broadcasts and is not coupled.
    """

    def walk(self, ctx, rec, node, ins):
        const_weights(ctx, rec)
        return _broadcast(ctx, rec, node, ins)

    def channel_map(self, rec, node):
        return elementwise_map(node)


class Concat(Handler):
    """Concatenate on the channel axis: an ordered composite of the inputs."""

    def walk(self, ctx, rec, node, ins):
        rank = len(output_shape(node))
        axis = rec.layer.axis
        if axis % rank != rank - 1:
            return Tie().walk(ctx, rec, node, ins)
        return [tuple(p for ch in ins for p in ch)]

    def channel_map(self, rec, node):
        rank = len(output_shape(node))
        if rec.layer.axis % rank != rank - 1:
            return elementwise_map(node)
        sizes = [t.shape[-1] for t in node.arguments.keras_tensors]
        starts = np.cumsum([0] + sizes)
        maps = []
        for size, start in zip(sizes, starts):
            m = np.full(starts[-1], -1)
            m[start:start + size] = np.arange(size)
            maps.append(m)
        return maps


class GroupNorm(Normalize):
    """GroupNormalization over channels: per-channel gamma/beta.

    The group count is kept, so the width moves in multiples of ``groups``;
    with one channel per group (``groups`` equal to the width, or -1) the
    layer is an instance norm and its ``groups`` follows the width instead.
    """

    def walk(self, ctx, rec, node, ins):
        outs = super().walk(ctx, rec, node, ins)
        groups = rec.layer.groups
        per_channel = _acts_on_channels(rec.layer, len(input_shape(node)))
        if per_channel and groups not in (-1, width_of(ctx, ins[0])):
            ctx.multiple_of(rec, ins[0], groups)
        return outs

    def configure(self, rec, config, width):
        spec = rec.layer.input_spec  # set when the layer was built
        original = next(iter(spec.axes.values()))
        if _acts_on_channels(rec.layer, spec.ndim) and config["groups"] == original:
            config["groups"] = channels_width(rec.inputs[0][0], width)
        return config


_REGISTRY: dict[type | str, Handler] = {}


def register_handler(layer_class, rule):
    """Teach the package how channels flow through ``layer_class``.

    The handler serves profiling, solving, rebuilding and the pruning
    baselines alike (see :class:`Handler` for a worked example).

    Args:
        layer_class: a ``keras.layers.Layer`` (or ``keras.Operation``) subclass,
            or its qualified name ``"module.Class"`` (e.g.
            ``"keras_hub.src.models.hgnetv2.hgnetv2_layers.HGNetV2LearnableAffineBlock"``):
            a name registers a class of an optional library without importing
            it, and matches once that library's class is met.
        rule: ``"tie"`` (output channels = input channels, per-channel weights
            scale with width), ``"fixed"`` (opaque, channels never change),
            ``"broadcast"`` (element-wise op over several inputs), or a
            :class:`Handler` instance for full control.
    """
    named = {"tie": Tie, "fixed": Fixed, "broadcast": Broadcast}
    if isinstance(rule, str):
        if rule not in named:
            raise ValueError(f"rule must be one of {sorted(named)} or a Handler, got {rule!r}")
        rule = named[rule]()
    if not isinstance(rule, Handler):
        raise TypeError(f"rule must be a string or a Handler instance, got {rule!r}")
    if not isinstance(layer_class, (type, str)):
        raise TypeError(f"layer_class must be a class or a 'module.Class' name, got {layer_class!r}")
    _REGISTRY[layer_class] = rule


def handler_of(op):
    """The handler registered for ``op``'s class or a base class (by the class or
    by its qualified name), or ``None``."""
    for cls in type(op).__mro__:
        for key in (cls, f"{cls.__module__}.{cls.__qualname__}"):
            if key in _REGISTRY:
                return _REGISTRY[key]
    return None


def lookup(op, path, ignored=False):
    """The handler for operation ``op`` (searched along its class's MRO).

    Unknown classes get the opaque rule :data:`OPAQUE` when ``ignored``, and
    an :class:`UnsupportedLayerError` otherwise.
    """
    handler = handler_of(op)
    if handler is not None:
        return handler
    if ignored:
        return OPAQUE
    raise UnsupportedLayerError(
        f"Layer {path!r} of class {type(op).__name__} is not supported: the "
        "walker does not know how its channels flow. Either keep its channels "
        "fixed with {ignore}, or describe it with "
        f"keras_precrop.register_handler({type(op).__name__}, 'tie' | 'fixed' | ...).",
        ignore=[path]
    )


OPAQUE = Fixed()  # the rule of ignored layers that no handler accepts

for _cls in (L.Conv1D, L.Conv2D, L.Conv3D):
    register_handler(_cls, Conv())
for _cls in (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose):
    register_handler(_cls, ConvTranspose())
register_handler(L.Dense, Dense())
register_handler(L.EinsumDense, EinsumDense())
register_handler(L.Embedding, TokenEmbedding())
register_handler(L.ReversibleEmbedding, ReversibleEmbedding())
for _cls in (L.DepthwiseConv1D, L.DepthwiseConv2D):
    register_handler(_cls, Depthwise())
for _cls in (L.SeparableConv1D, L.SeparableConv2D):
    register_handler(_cls, Separable())
for _cls in (L.Add, _custom.PrefixAdd):
    register_handler(_cls, Merge())
for _cls in (L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum):
    register_handler(_cls, Broadcast())
register_handler(L.Concatenate, Concat())
register_handler(L.MultiHeadAttention, MultiHeadAttention())
register_handler(L.GroupQueryAttention, GroupedQueryAttention())
register_handler(L.GroupNormalization, GroupNorm())
# Layers of keras.applications and keras_hub, by name (nothing is imported):
# ConvNeXt's per-channel LayerScale, InceptionResNetV2's ``x + scale * r`` (a
# residual add whose inputs it ties), HGNetV2's scalar affine, MobileNetV5's
# per-channel layer scale, RMS norm over channels and per-example drop path.
for _name, _rule in (
    ("keras.src.applications.convnext.LayerScale", Tie("projection_dim")),
    ("keras.src.applications.inception_resnet_v2.CustomScaleLayer", Broadcast()),
    ("keras_hub.src.models.hgnetv2.hgnetv2_layers.HGNetV2LearnableAffineBlock", Tie()),
    ("keras_hub.src.models.mobilenetv5.mobilenetv5_layers.LayerScale2d", Tie("dim")),
    ("keras_hub.src.models.mobilenetv5.mobilenetv5_layers.RmsNorm2d", Normalize("dim")),
    ("keras_hub.src.models.mobilenetv5.mobilenetv5_layers.DropPath", Tie()),
    # Vision transformers' per-channel layer scale and per-example drop path.
    ("keras_hub.src.models.dinov2.dinov2_layers.DINOV2LayerScale", Tie("hidden_dim")),
    ("keras_hub.src.models.dinov3.dinov3_layers.DINOV3LayerScale", Tie("hidden_dim")),
    ("keras_hub.src.models.dinov2.dinov2_layers.DINOV2DropPath", Tie()),
    ("keras_hub.src.models.dinov3.dinov3_layers.DINOV3DropPath", Tie()),
    ("keras_hub.src.models.mit.mit_layers.DropPath", Tie()),
    ("keras_hub.src.models.swin_transformer.swin_transformer_layers.DropPath", Tie()),
    # Learned positions added to a sequence: one vector per position along the hidden channels.
    ("keras_hub.src.layers.modeling.position_embedding.PositionEmbedding", Tie()),
    *VIT_EMBEDDINGS,  # patch embeddings that create a vision transformer's stream (embedding.py)
):
    register_handler(_name, _rule)
register_handler(L.Flatten, Flatten())
register_handler(L.Reshape, Reshape())
register_handler(_custom.ChannelSlice, Slice())
register_handler(L.BatchNormalization, BatchNorm())
for _cls in (L.LayerNormalization, L.UnitNormalization, L.RMSNormalization, L.Softmax):
    register_handler(_cls, Normalize())
for _cls in (
    L.ReLU, L.LeakyReLU, L.ELU, L.PReLU,
    L.MaxPooling1D, L.MaxPooling2D, L.MaxPooling3D,
    L.AveragePooling1D, L.AveragePooling2D, L.AveragePooling3D,
    L.GlobalMaxPooling1D, L.GlobalMaxPooling2D, L.GlobalMaxPooling3D,
    L.GlobalAveragePooling1D, L.GlobalAveragePooling2D, L.GlobalAveragePooling3D,
    L.Dropout, L.SpatialDropout1D, L.SpatialDropout2D, L.SpatialDropout3D,
    L.GaussianNoise, L.GaussianDropout, L.AlphaDropout, L.ActivityRegularization,
    L.ZeroPadding1D, L.ZeroPadding2D, L.ZeroPadding3D,
    L.Cropping1D, L.Cropping2D, L.Cropping3D,
    L.UpSampling1D, L.UpSampling2D, L.UpSampling3D, L.Resizing,
    L.Rescaling, L.Normalization, L.Identity,
):
    register_handler(_cls, Tie())
# keras.ops calls recorded inside functional models (e.g. ``x * 0.5``).
# Comparisons and logic too: the masks of ``mask_zero`` embeddings (``not_equal``) and
# of the layers that combine them (``logical_or``, ``logical_and``).
for _name in ("Add", "Subtract", "Multiply", "Divide", "TrueDivide", "Maximum",
              "Minimum", "Power", "Where", "Equal", "NotEqual", "Less", "LessEqual",
              "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalXor"):
    if hasattr(_ops_np, _name):
        register_handler(getattr(_ops_np, _name), Broadcast())
for _name, _rule in (("Pad", OpPad()), ("Reshape", OpReshape()), ("Concatenate", Concat()),
                     ("Mean", OpAxes()), ("Sum", OpAxes()), ("Max", OpAxes()),
                     ("Min", OpAxes()), ("Squeeze", OpAxes()), ("ExpandDims", OpAxes()),
                     ("Split", OpSplit()), ("GetItem", OpGetItem())):
    if hasattr(_ops_np, _name):
        register_handler(getattr(_ops_np, _name), _rule)
# A nested model that a trace dissolves converts its inputs (``Functional.call``).
for _op in (_ops_core.Cast, _ops_core.ConvertToTensor):
    register_handler(_op, Tie())
for _module, _names in (
    (_ops_np, ("Abs", "Absolute", "Negative", "Square", "Sqrt", "Exp", "Log",
               "Clip", "Tanh", "Sign", "LogicalNot")),
    (_ops_nn, ("Relu", "Relu6", "Sigmoid", "HardSigmoid", "Silu", "HardSilu",
               "Swish", "HardSwish", "Gelu", "Elu", "Selu", "LeakyRelu",
               "Softplus", "Softsign", "Mish")),
    (_activations, ("ReLU", "Mish")),  # keras.activations.relu(x) on a symbolic tensor
):
    for _name in _names:
        if hasattr(_module, _name):
            register_handler(getattr(_module, _name), Tie())
register_handler(_ops_nn.Softmax, Normalize())
register_handler(L.Activation, Activation())
# keras.ops spatial resampling of channels-last images (keras_hub's MobileNetV5 fusion adapter).
for _op in (_ops_image.Resize, _ops_nn.AveragePool, _ops_nn.MaxPool):
    register_handler(_op, Tie())
