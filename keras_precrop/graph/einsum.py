"""How channels flow through ``keras.layers.EinsumDense``, read from its equation.

An ``EinsumDense`` computes ``einsum(equation, x, kernel)``. As everywhere in
the package, a tensor's channel axis is its last one and every other axis
keeps its size. The equation's labels then fall into roles: the input's
last label is its channel axis, the output's last label the channels the
layer writes; every other label is a constant axis (the batch, tokens,
heads) that multiplies costs. Two layouts are described:

* **kernel**: the input's channels are contracted with the kernel and the
  output's last axis is a kernel axis (``"ab,bc->ac"``, ``"abc,cd->abd"``).
  The layer creates new channels, which ``output_shape``'s last entry holds.
  Further output axes of the kernel are constant multipliers:
  ``"abc,cde->abde"`` writes ``d`` heads of ``e`` channels each, and the new
  channels are ``e``. Further contracted axes of the input are constant too:
  ``"abcd,cde->abe"`` (an attention output projection) reads ``c`` heads of
  ``d`` channels, and only ``d`` is the input's channels.
* **through**: the input's channel axis is the output's last axis and not a
  kernel axis (``"abc,bd->adc"``, token mixing; an ellipsis on the right,
  ``"ab...,bc->ac..."``): the channels pass through as through an
  activation, and only the MACs grow with them.

Everything else (a channel axis moved off the end, a label summed without
the kernel, a label shared by input, kernel and output) is refused, naming
the layer and the equation. Parameters are the kernel's and bias'
(``bias_axes``) sizes; MACs are the product of every label's size but the
batch's, as the einsum computes them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph.channels import channels_width, input_shape
from keras_precrop.graph.handler_base import Handler, WeightSpec


@dataclasses.dataclass(frozen=True)
class _Equation:
    """An ``EinsumDense`` equation with its ellipsis spelled out as labels ``"0"``, ``"1"``, ...

    Attributes:
        inputs, kernel, output: the labels of each operand's axes, in order.
        bias: the labels ``bias_axes`` names.
        named_last: whether the output's last axis is named in the equation
            (not elided), so that ``output_shape``'s last entry is its size.
    """

    inputs: tuple
    kernel: tuple
    output: tuple
    bias: tuple
    named_last: bool

    @classmethod
    def of(cls, layer, rank):
        """The equation of ``layer`` for an input of ``rank`` axes."""
        lhs, out = layer.equation.replace(" ", "").split("->")
        x, kernel = lhs.split(",")
        named = x.replace("...", "")
        elided = tuple(str(i) for i in range(rank - len(named))) if "..." in x else ()
        return cls(_labels(x, elided), tuple(kernel), _labels(out, elided),
                   tuple(layer.bias_axes or ""), not out.endswith("..."))

    @property
    def through(self):
        """Whether the input's channels pass through to the output's last axis."""
        return self.inputs[-1] == self.output[-1] and self.inputs[-1] not in self.kernel

    def problem(self):
        """Why the equation cannot be described in channels, or ``None``."""
        c_in, c_out = self.inputs[-1], self.output[-1]
        if self.inputs[0] != self.output[0] or self.inputs[0] in self.kernel:
            return "its first axis is not a batch axis the output keeps first"
        for label in set(self.inputs + self.kernel + self.output):
            places = (label in self.inputs) + (label in self.kernel) + (label in self.output)
            if places != 2:
                return (f"its label {label!r} is in all of input, kernel and output" if places == 3
                        else f"it sums the input's axis {label!r} without the kernel")
        if self.through:
            return None
        if c_in in self.output:
            return "it moves the input's channel (last) axis off the output's end"
        if c_out not in self.kernel:
            return "its output's last axis is an axis of its input other than the channels"
        return None

    def sizes(self, shape, kernel_shape):
        """Each label's size, from the input's shape and the kernel's."""
        return {**dict(zip(self.kernel, kernel_shape)), **dict(zip(self.inputs, shape))}


def _labels(spec, elided):
    """The labels of one operand: its letters, with ``elided`` in place of its ellipsis."""
    letters = tuple(spec.replace("...", ""))
    if spec.startswith("..."):
        return elided + letters
    return letters + (elided if spec.endswith("...") else ())


class EinsumDense(Handler):
    """``keras.layers.EinsumDense``: input and output channels read from its equation.

    Costs are exact: the kernel has ``K * c_in * c_out`` parameters (``K``
    the sizes of its other axes; ``K * c_in`` where channels pass through)
    and a call ``M * c_in * c_out`` MACs (``M`` every other label's size but
    the batch's); the bias has one parameter per entry of ``bias_axes``' axes.
    The rebuilt layer's ``output_shape`` ends with the new width.
    """

    def walk(self, ctx, rec, node, ins):
        shape = input_shape(node)
        eq = _read(rec, len(shape))
        sizes = eq.sizes(shape, rec.layer.kernel.shape)
        c_in, c_out = eq.inputs[-1], eq.output[-1]
        others = set(eq.inputs + eq.kernel + eq.output) - {eq.inputs[0], c_in, c_out}
        macs = math.prod(sizes[label] for label in others)
        kernel = math.prod(sizes[label] for label in eq.kernel if label not in (c_in, c_out))
        if eq.through:
            out = ins[0]
            ctx.add_term(rec, kernel, 0)
            for p in out:
                ctx.add_term(rec, 0, macs, p)
        else:
            out = ctx.new_output(rec, sizes[c_out])
            ctx.add_kernel(rec, ins[0], out, params=kernel, macs=macs)
        if eq.bias:
            bias = math.prod(sizes[label] for label in eq.bias if label != c_out)
            for p in (out if c_out in eq.bias else (None,)):
                ctx.add_term(rec, bias, 0, p)
        return [out]

    def configure(self, rec, config, width):
        """``output_shape`` with its last entry, the output's channels, at the new width."""
        shape = list(config["output_shape"])
        eq = _Equation.of(rec.layer, rec.layer.input_spec.ndim)
        if eq.named_last and shape[-1] is not None:
            shape[-1] = channels_width(rec.outputs[0][0], width)
        return {**config, "output_shape": tuple(shape)}

    def specs_of(self, layer):
        """The kernel's input and output channel axes (none where channels pass through); the
        bias when it is per output channel."""
        if not layer.built:
            return {}
        eq = _Equation.of(layer, layer.input_spec.ndim)
        if eq.problem() is not None:
            return {}
        specs = {}
        if not eq.through:
            specs["kernel"] = WeightSpec("kernel_constraint", "kernel",
                                         eq.kernel.index(eq.inputs[-1]),
                                         eq.kernel.index(eq.output[-1]))
        if eq.output[-1] in eq.bias:
            specs["bias"] = WeightSpec("bias_constraint", "bias")
        return specs

    def channel_map(self, rec, node):
        """Channel to channel where the channels pass through; else every output reads every input."""
        shape = input_shape(node)
        if _Equation.of(rec.layer, len(shape)).through:
            return [np.arange(shape[-1])]
        return None


def _read(rec, rank):
    """The layer's equation, or an :class:`UnsupportedLayerError` saying why it is refused."""
    layer = rec.layer
    eq = _Equation.of(layer, rank)
    why = eq.problem()
    if why is not None:
        raise UnsupportedLayerError(
            f"{rec.path} (EinsumDense {layer.equation!r}): {why}, so its channels cannot be "
            "described. Keep its channels fixed with {ignore}.", ignore=[rec.path])
    return eq
