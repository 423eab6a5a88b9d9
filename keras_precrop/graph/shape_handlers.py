"""Handlers of shape operations: flatten, reshape, channel slices, pads, axis ops, splits.

Each keeps the channel axis last and whole, or says why it cannot; the
handler table (``handlers.py``) registers them for their layer and
``keras.ops`` classes.
"""

from __future__ import annotations

import math

import numpy as np

from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph.channels import Part, as_part, channels_width, input_shape, output_shape
from keras_precrop.graph.handler_base import Handler, elementwise_map


class Flatten(Handler):
    """Flatten: channel c of every pixel, so each part repeats per pixel."""

    def walk(self, ctx, rec, node, ins):
        pixels = math.prod(input_shape(node)[1:-1])
        return [tuple(Part(p.segment, p.mult * pixels) for p in ins[0])]

    def channel_map(self, rec, node):
        shape = input_shape(node)
        return [np.tile(np.arange(shape[-1]), math.prod(shape[1:-1]))]


class Reshape(Handler):
    """Reshape that keeps the channel axis last (e.g. [B,C] -> [B,1,1,C]).

    A reshape to one axis is a flatten; anything else mixes channels with
    other axes and is refused.
    """

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
            f"to other axes. Pass {{ignore}} to keep it fixed.", ignore=[rec.path]
        )

    def channel_map(self, rec, node):
        if len(output_shape(node)) == 2:
            return Flatten().channel_map(rec, node)
        return [np.arange(input_shape(node)[-1])]

    def configure(self, rec, config, width):
        target = list(config["target_shape"])
        target[-1] = channels_width(rec.outputs[0][0], width)
        config["target_shape"] = tuple(target)
        return config


class Slice(Handler):
    """ChannelSlice: a prefix of its input, never wider than it."""

    def walk(self, ctx, rec, node, ins):
        src = as_part(ins[0], rec.path)
        out = ctx.new_output(rec, rec.layer.width)
        if rec.calls == 0:
            ctx.at_most(rec.out_segment, src.segment)
        return [out]

    def configure(self, rec, config, width):
        config["width"] = width(rec.out_segment)
        return config

    def channel_map(self, rec, node):
        return [np.arange(rec.layer.width)]


def _channel_kept(node):
    """Whether an op leaves the channel count unchanged and on the last axis."""
    return input_shape(node)[-1] == output_shape(node)[-1]


def _refuse_op(rec, node, why):
    raise UnsupportedLayerError(
        f"{rec.path} ({type(rec.layer).__name__} {input_shape(node)} -> "
        f"{output_shape(node)}) {why}. Pass {{ignore}} to keep "
        "its channels fixed.", ignore=[rec.path]
    )


class OpPad(Handler):
    """``keras.ops.pad``: spatial padding keeps the channels; padding them is refused."""

    def walk(self, ctx, rec, node, ins):
        if not _channel_kept(node):
            _refuse_op(rec, node, "pads the channel axis")
        return [ins[0]]

    def channel_map(self, rec, node):
        return elementwise_map(node)


class OpReshape(Handler):
    """``keras.ops.reshape`` that keeps channels last.

    Channels flow through as through a ``Reshape`` layer: a target shape that
    spells out the channel count last (``(-1, 1, 1, C)`` in a
    squeeze-and-excitation block) is rebuilt with the new count. A flatten
    (``(-1, H * W * C)``) is replayed as recorded, so one that spells out its
    size keeps its channels fixed. Sizes left open (``None`` past the
    batch axis) are refused by name.
    """

    def walk(self, ctx, rec, node, ins):
        shape_in, shape_out = input_shape(node), output_shape(node)
        if None in shape_in[1:] + shape_out[1:]:
            _refuse_op(rec, node, "reshapes sizes it leaves open (None), which neither its "
                       "channels nor the costs after it can be read from")
        flatten = len(shape_out) == 2
        if not flatten and not (shape_in[-1] == shape_out[-1] and math.prod(
                shape_in[1:-1]) == math.prod(shape_out[1:-1])):
            _refuse_op(rec, node, "moves channels to other axes")
        outs = Flatten().walk(ctx, rec, node, ins) if flatten else [ins[0]]
        if flatten and list(rec.layer.newshape)[-1] != -1:
            ctx.fix(ins[0])
            ctx.note(f"{rec.path}: reshape to a fixed shape; its channels are kept fixed.")
        return outs

    channel_map = Reshape.channel_map

    def rebuild_op(self, rec, op, width):
        newshape = list(op.newshape)
        if len(newshape) == 2 or newshape[-1] == -1:
            return op
        newshape[-1] = channels_width(rec.outputs[0][0], width)
        return type(op)(tuple(newshape), name=op.name)


class OpAxes(Handler):
    """``keras.ops`` reductions and axis ops (mean, sum, max, min, squeeze,
    expand_dims) that leave the channel axis last and whole."""

    def walk(self, ctx, rec, node, ins):
        shape_in, shape_out = input_shape(node), output_shape(node)
        axis = getattr(rec.layer, "axis", None)
        axes = () if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
        rank = max(len(shape_in), len(shape_out))
        if axis is None or any(a % rank == rank - 1 for a in axes) or not _channel_kept(node):
            _refuse_op(rec, node, "reduces or moves the channel axis")
        return [ins[0]]

    def channel_map(self, rec, node):
        return [np.arange(input_shape(node)[-1])]


class OpSplit(Handler):
    """``keras.ops.split``: consecutive pieces of the channel axis that keep their proportions.

    A split of another axis keeps the channels: every output has the
    input's. A split of the channel axis makes each output a piece in the
    input's group that keeps its share of the input's width
    (``ctx.split``): into ``n`` equal sections (an int) the input moves in
    multiples of ``n``, each piece is one ``n``-th of it, and the op replays
    as recorded; at explicit indices each piece keeps its share and
    ``rebuild_op`` moves the indices. Splitting a concatenation is refused.
    """

    def walk(self, ctx, rec, node, ins):
        rank = len(input_shape(node))
        if rec.layer.axis % rank != rank - 1:
            return [ins[0]] * len(node.outputs)
        if len(ins[0]) != 1:
            _refuse_op(rec, node, "splits the channels of a concatenation")
        return ctx.split(rec, ins[0], [t.shape[-1] for t in node.outputs])

    def rebuild_op(self, rec, op, width):
        pieces = rec.outputs[0]
        if isinstance(op.indices_or_sections, int) or pieces[0] == rec.inputs[0][0]:
            return op  # equal sections, or a split of another axis
        ends = np.cumsum([channels_width(ch, width) for ch in pieces[:-1]])
        return type(op)(tuple(int(e) for e in ends), axis=op.axis, name=op.name)

    def channel_map(self, rec, node):
        """Channel to channel: the pieces together are the input's channels in order."""
        return [np.arange(input_shape(node)[-1])]


class OpGetItem(Handler):
    """``x[...]`` on a symbolic tensor that leaves the channel axis last and whole.

    A vision transformer's classifier takes its class token with
    ``x[:, 0, :]``: the channels flow through. An index that selects
    channels (``x[..., :8]``) is refused by name.
    """

    def walk(self, ctx, rec, node, ins):
        if not _channel_entry_whole(node.arguments.args[1], len(input_shape(node))):
            _refuse_op(rec, node, "indexes the channel axis")
        return [ins[0]]

    def channel_map(self, rec, node):
        return [np.arange(input_shape(node)[-1])]


def _channel_entry_whole(key, rank):
    """Whether index ``key`` on a tensor of ``rank`` axes takes the last axis whole."""
    key = tuple(key) if isinstance(key, tuple) else (key,)
    if Ellipsis in key:
        after = key[key.index(Ellipsis) + 1:]
        consumed = [k for k in after if k is not None]
        return not consumed or _whole(consumed[-1])
    consumed = [k for k in key if k is not None]
    return len(consumed) < rank or _whole(consumed[rank - 1])


def _whole(entry):
    """Whether one index entry takes its axis whole (``:``)."""
    return isinstance(entry, slice) and entry == slice(None)
