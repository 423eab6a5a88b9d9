"""How channels flow through each layer class: the handler registry.

A handler has two jobs: while the graph is walked it maps input channel
descriptors to output descriptors and declares the layer's bilinear cost terms
(``walk``); when the model is rebuilt it rewrites the layer's config for new
widths (``configure``). Handlers are looked up along the layer class's MRO, so
subclasses of built-in layers inherit their rule; ``register_handler`` teaches
the walker a custom layer.
"""

from __future__ import annotations

import importlib
import math

import keras
from keras import layers as L
from keras.src.ops import core as _ops_core
from keras.src.ops import nn as _ops_nn
from keras.src.ops import numpy as _ops_np

from keras_precrop import layers as _custom
from keras_precrop.graph import (
    Part,
    UnsupportedLayerError,
    as_part,
    input_shape,
    output_shape,
    width_of,
)


class Handler:
    """Base rule: subclasses implement ``walk`` and, if needed, ``configure``."""

    rule = "base"

    def walk(self, ctx, rec, node, ins):
        """Return output descriptors (one per output tensor); add cost terms."""
        raise NotImplementedError

    def configure(self, rec, config, width):
        """Return ``config`` updated for new widths (``width(segment)``)."""
        return config


def _weights(op):
    """An operation's weights (plain ``keras.ops`` operations have none)."""
    return getattr(op, "weights", [])


def _const_weights(ctx, rec):
    """Count all of a layer's weights as width-independent constants."""
    if rec.calls == 0 and _weights(rec.layer):
        ctx.add_term(rec, sum(math.prod(w.shape) for w in _weights(rec.layer)), 0)


class Tie(Handler):
    """Output channels are the input channels (BN, activations, pooling, ...).

    Weights whose last axis is the channel axis (BN's gamma and statistics,
    LayerNorm's gamma, PReLU's alpha) scale with the width; others are
    constants.
    """

    rule = "tie"

    def walk(self, ctx, rec, node, ins):
        channels = ins[0]
        for other in ins[1:]:
            ctx.tie(channels, other, rec.path)
        if rec.calls == 0:
            total = width_of(ctx, channels)
            per_channel = _acts_on_channels(rec.layer, len(input_shape(node)))
            for w in _weights(rec.layer):
                shape = tuple(w.shape)
                size = math.prod(shape)
                if per_channel and shape and shape[-1] == total:
                    for p in channels:
                        ctx.add_term(rec, size // total, 0, p)
                else:
                    ctx.add_term(rec, size, 0)
        return [channels] * len(node.outputs)


def _acts_on_channels(layer, rank):
    """Whether a layer's weights follow the channel axis (its ``axis`` says)."""
    axis = getattr(layer, "axis", None)
    if axis is None:
        return True
    axes = [axis] if isinstance(axis, int) else list(axis)
    return any(a % rank == rank - 1 for a in axes)


class Fixed(Handler):
    """An opaque block: its channels never change and its cost is constant."""

    rule = "fixed"

    def walk(self, ctx, rec, node, ins):
        for ch in ins:
            ctx.fix(ch)
        _const_weights(ctx, rec)
        outs = []
        for i, t in enumerate(node.outputs):
            seg = ctx.new_segment(t.shape[-1], f"{rec.path}:{i}", fixed=True)
            outs.append((Part(seg),))
        return outs


class _Source(Handler):
    """A layer that creates new output channels from its input channels."""

    rule = "source"
    width_key = "filters"

    def _out(self, ctx, rec, node, ins):
        """The layer's output segment; later calls are tied to the first."""
        if rec.out_segment is None:
            width = rec.layer.get_config()[self.width_key]
            rec.out_segment = ctx.new_segment(width, rec.path)
        return Part(rec.out_segment)

    def _reads(self, rec, ins):
        """Record the input segments this layer reads (for residual views)."""
        for p in ins[0]:
            rec.readers.append(p.group)

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

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            raise UnsupportedLayerError(
                f"{rec.path}: only channels_last convolutions are supported."
            )
        groups = getattr(layer, "groups", 1)
        if groups > 1 and groups == width_of(ctx, ins[0]):
            return [_depthwise(ctx, rec, node, ins, layer.filters // groups,
                               math.prod(layer.kernel_size), layer.use_bias)]
        out = self._out(ctx, rec, node, ins)
        if groups > 1:
            ctx.multiple_of(rec, ins[0], groups)
            ctx.multiple_of(rec, (out,), groups)
        self._reads(rec, ins)
        kernel = math.prod(layer.kernel_size) / groups
        spatial_shape = input_shape(node) if self.transpose else output_shape(node)
        pixels = math.prod(spatial_shape[1:-1])
        first = rec.calls == 0
        for p in ins[0]:
            ctx.add_term(rec, kernel if first else 0, kernel * pixels, p, out)
        if first:
            if layer.use_bias:
                ctx.add_term(rec, 1, 0, out)
            ctx.add_kernel(rec, ins[0], (out,))
        return [(out,)]


    def configure(self, rec, config, width):
        groups = config.get("groups", 1)
        if groups > 1 and rec.out_segment is None:  # depthwise: follows its input
            channels = sum(width(p.group) * p.mult for p in rec.inputs[0][0])
            config["filters"] = config["filters"] // groups * channels
            config["groups"] = channels
            return config
        return super().configure(rec, config, width)


class ConvTranspose(Conv):
    """Conv*Transpose: MACs per *input* pixel."""

    transpose = True


class Dense(_Source):
    """Dense on the last axis; leading axes (beyond batch) multiply MACs."""

    width_key = "units"

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        out = self._out(ctx, rec, node, ins)
        self._reads(rec, ins)
        rows = math.prod(input_shape(node)[1:-1])
        first = rec.calls == 0
        for p in ins[0]:
            ctx.add_term(rec, 1 if first else 0, rows, p, out)
        if first:
            if layer.use_bias:
                ctx.add_term(rec, 1, 0, out)
            ctx.add_kernel(rec, ins[0], (out,))
        return [(out,)]


def _depthwise(ctx, rec, node, ins, multiplier, kernel, bias):
    """Cost terms of a depthwise kernel; returns the output descriptor."""
    pixels = math.prod(output_shape(node)[1:-1])
    first = rec.calls == 0
    for p in ins[0]:
        ctx.add_term(rec, kernel * multiplier if first else 0,
                     kernel * multiplier * pixels, p)
        if bias and first:
            ctx.add_term(rec, multiplier, 0, p)
    if first:
        ctx.add_kernel(rec, ins[0])
    return tuple(Part(p.group, p.mult * multiplier) for p in ins[0])


class Depthwise(Handler):
    """DepthwiseConv: output channels are ``depth_multiplier`` x input's."""

    rule = "depthwise"

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        out = _depthwise(ctx, rec, node, ins, layer.depth_multiplier,
                         math.prod(layer.kernel_size), layer.use_bias)
        return [out]


class Separable(_Source):
    """SeparableConv: a depthwise kernel then a pointwise one."""

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        out = self._out(ctx, rec, node, ins)
        self._reads(rec, ins)
        mid = _depthwise(ctx, rec, node, ins, layer.depth_multiplier,
                         math.prod(layer.kernel_size), False)
        pixels = math.prod(output_shape(node)[1:-1])
        first = rec.calls == 0
        for p in mid:
            ctx.add_term(rec, 1 if first else 0, pixels, p, out)
        if first:
            if layer.use_bias:
                ctx.add_term(rec, 1, 0, out)
            ctx.add_kernel(rec, mid, (out,))
        return [(out,)]


class Merge(Handler):
    """Add: a residual stream (prefix or tied, resolved in ``graph.py``)."""

    rule = "merge"

    def walk(self, ctx, rec, node, ins):
        _const_weights(ctx, rec)
        if any(len(ch) != 1 or ch[0].mult != 1 for ch in ins):
            return _broadcast(ctx, rec, node, ins)
        width = max(width_of(ctx, ch) for ch in ins)
        seg = ctx.new_segment(width, rec.path)
        ctx.merges.append((seg, [ch[0].group for ch in ins], rec.path))
        return [(Part(seg),)]


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

    rule = "broadcast"

    def walk(self, ctx, rec, node, ins):
        _const_weights(ctx, rec)
        return _broadcast(ctx, rec, node, ins)


class Concat(Handler):
    """Concatenate on the channel axis: an ordered composite of the inputs."""

    rule = "concat"

    def walk(self, ctx, rec, node, ins):
        rank = len(output_shape(node))
        axis = rec.layer.axis
        if axis % rank != rank - 1:
            return Tie().walk(ctx, rec, node, ins)
        return [tuple(p for ch in ins for p in ch)]


class Flatten(Handler):
    """Flatten: channel c of every pixel, so each part repeats per pixel."""

    rule = "flatten"

    def walk(self, ctx, rec, node, ins):
        pixels = math.prod(input_shape(node)[1:-1])
        return [tuple(Part(p.group, p.mult * pixels) for p in ins[0])]


class Reshape(Handler):
    """Reshape that keeps the channel axis last (e.g. [B,C] -> [B,1,1,C]).

    A reshape to one axis is a flatten; anything else mixes channels with
    other axes and is refused.
    """

    rule = "reshape"

    def walk(self, ctx, rec, node, ins):
        shape_in, shape_out = input_shape(node), output_shape(node)
        if len(shape_out) == 2:
            return Flatten().walk(ctx, rec, node, ins)
        if shape_in[-1] == shape_out[-1] and math.prod(shape_in[1:-1]) == math.prod(
            shape_out[1:-1]
        ):
            return [ins[0]]
        raise UnsupportedLayerError(
            f"{rec.path} (Reshape {shape_in} -> {shape_out}) moves channels "
            f"to other axes. Pass ignore=[{rec.layer.name!r}] to keep it fixed."
        )

    def configure(self, rec, config, width):
        target = list(config["target_shape"])
        target[-1] = sum(width(p.group) * p.mult for p in rec.outputs[0][0])
        config["target_shape"] = tuple(target)
        return config


class Slice(Handler):
    """ChannelSlice: a prefix of its input, never wider than it."""

    rule = "slice"

    def walk(self, ctx, rec, node, ins):
        src = as_part(ins[0], rec.path)
        if rec.out_segment is None:
            rec.out_segment = ctx.new_segment(rec.layer.width, rec.path)
            ctx.leq.append((rec.out_segment, src.group))
        return [(Part(rec.out_segment),)]

    def configure(self, rec, config, width):
        config["width"] = width(rec.out_segment)
        return config


class GroupNorm(Tie):
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
            config["groups"] = sum(width(p.group) * p.mult for p in rec.inputs[0][0])
        return config


class LayerScale(Tie):
    """ConvNeXt's LayerScale: a per-channel scale whose config names its width."""

    def configure(self, rec, config, width):
        config["projection_dim"] = sum(width(p.group) * p.mult for p in rec.inputs[0][0])
        return config


def _channel_kept(node):
    """Whether an op leaves the channel count unchanged and on the last axis."""
    return input_shape(node)[-1] == output_shape(node)[-1]


def _refuse_op(rec, node, why):
    raise UnsupportedLayerError(
        f"{rec.path} ({type(rec.layer).__name__} {input_shape(node)} -> "
        f"{output_shape(node)}) {why}. Pass ignore=[{rec.layer.name!r}] to keep "
        "its channels fixed."
    )


class OpPad(Handler):
    """``keras.ops.pad``: spatial padding keeps the channels; padding them is refused."""

    rule = "pad"

    def walk(self, ctx, rec, node, ins):
        if not _channel_kept(node):
            _refuse_op(rec, node, "pads the channel axis")
        return [ins[0]]


class OpReshape(Handler):
    """``keras.ops.reshape`` that keeps channels last.

    The op is replayed as recorded, so a target shape that spells out the
    channel count (rather than ``-1``) keeps those channels fixed.
    """

    rule = "reshape"

    def walk(self, ctx, rec, node, ins):
        shape_in, shape_out = input_shape(node), output_shape(node)
        flatten = len(shape_out) == 2
        if not flatten and not (shape_in[-1] == shape_out[-1] and math.prod(
                shape_in[1:-1]) == math.prod(shape_out[1:-1])):
            _refuse_op(rec, node, "moves channels to other axes")
        outs = Flatten().walk(ctx, rec, node, ins) if flatten else [ins[0]]
        if list(rec.layer.newshape)[-1] != -1:
            ctx.fix(ins[0])
            ctx.notes.append(f"{rec.path}: reshape to a fixed shape; its channels are kept fixed.")
        return outs


class OpAxes(Handler):
    """``keras.ops`` reductions and axis ops (mean, sum, max, min, squeeze,
    expand_dims) that leave the channel axis last and whole."""

    rule = "axes"

    def walk(self, ctx, rec, node, ins):
        shape_in, shape_out = input_shape(node), output_shape(node)
        axis = getattr(rec.layer, "axis", None)
        axes = () if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
        rank = max(len(shape_in), len(shape_out))
        if axis is None or any(a % rank == rank - 1 for a in axes) or not _channel_kept(node):
            _refuse_op(rec, node, "reduces or moves the channel axis")
        return [ins[0]]


_REGISTRY: dict[type, Handler] = {}


def register_handler(layer_class, rule):
    """Teach the walker how channels flow through ``layer_class``.

    Args:
        layer_class: a ``keras.layers.Layer`` (or ``keras.Operation``) subclass.
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
    _REGISTRY[layer_class] = rule


def lookup(op, path, ignored=False):
    """The handler for operation ``op`` (searched along its class's MRO).

    Unknown classes get the opaque ``Fixed`` rule when ``ignored``, and an
    :class:`UnsupportedLayerError` otherwise (``op=None``: always ``Fixed``).
    """
    if op is None:
        return _REGISTRY_FIXED
    for cls in type(op).__mro__:
        if cls in _REGISTRY:
            return _REGISTRY[cls]
    if ignored:
        return _REGISTRY_FIXED
    raise UnsupportedLayerError(
        f"Layer {path!r} of class {type(op).__name__} is not supported: the "
        "walker does not know how its channels flow. Either keep its channels "
        f"fixed with ignore=[{op.name!r}], or describe it with "
        f"keras_precrop.register_handler({type(op).__name__}, 'tie' | 'fixed' | ...)."
    )


_REGISTRY_FIXED = Fixed()

for _cls in (L.Conv1D, L.Conv2D, L.Conv3D):
    register_handler(_cls, Conv())
for _cls in (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose):
    register_handler(_cls, ConvTranspose())
register_handler(L.Dense, Dense())
for _cls in (L.DepthwiseConv1D, L.DepthwiseConv2D):
    register_handler(_cls, Depthwise())
for _cls in (L.SeparableConv1D, L.SeparableConv2D):
    register_handler(_cls, Separable())
for _cls in (L.Add, _custom.PrefixAdd):
    register_handler(_cls, Merge())
for _cls in (L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum):
    register_handler(_cls, Broadcast())
register_handler(L.Concatenate, Concat())
register_handler(L.GroupNormalization, GroupNorm())
# keras.applications' own layers: ConvNeXt's per-channel LayerScale, and
# InceptionResNetV2's ``x + scale * r`` (a residual add whose inputs it ties).
for _module, _name, _rule in (
    ("keras.src.applications.convnext", "LayerScale", LayerScale()),
    ("keras.src.applications.inception_resnet_v2", "CustomScaleLayer", Broadcast()),
):
    _cls = getattr(importlib.import_module(_module), _name, None)
    if _cls is not None:
        register_handler(_cls, _rule)
register_handler(L.Flatten, Flatten())
register_handler(L.Reshape, Reshape())
register_handler(_custom.ChannelSlice, Slice())
for _cls in (
    L.BatchNormalization, L.LayerNormalization, L.UnitNormalization, L.RMSNormalization,
    L.Activation, L.ReLU, L.LeakyReLU, L.ELU, L.PReLU, L.Softmax,
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
for _name in ("Add", "Subtract", "Multiply", "Divide", "TrueDivide", "Maximum",
              "Minimum", "Power", "Where"):
    if hasattr(_ops_np, _name):
        register_handler(getattr(_ops_np, _name), Broadcast())
for _name, _rule in (("Pad", OpPad()), ("Reshape", OpReshape()), ("Concatenate", Concat()),
                     ("Mean", OpAxes()), ("Sum", OpAxes()), ("Max", OpAxes()),
                     ("Min", OpAxes()), ("Squeeze", OpAxes()), ("ExpandDims", OpAxes())):
    if hasattr(_ops_np, _name):
        register_handler(getattr(_ops_np, _name), _rule)
register_handler(_ops_core.Cast, Tie())
for _module, _names in (
    (_ops_np, ("Abs", "Absolute", "Negative", "Square", "Sqrt", "Exp", "Log",
               "Clip", "Tanh", "Sign")),
    (_ops_nn, ("Relu", "Relu6", "Sigmoid", "HardSigmoid", "Silu", "HardSilu",
               "Swish", "HardSwish", "Gelu", "Elu", "Selu", "LeakyRelu",
               "Softplus", "Softsign", "Softmax", "Mish")),
):
    for _name in _names:
        if hasattr(_module, _name):
            register_handler(getattr(_module, _name), Tie())
