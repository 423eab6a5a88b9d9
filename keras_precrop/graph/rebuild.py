"""Rebuild a functional model with new channel widths (fresh weights).

The rebuild replays the walked graph node by node, the way
``keras.models.clone_model`` does, but every layer is re-created from its
config with the widths a plan chose (``filters``/``units``/...), a stateless
``keras.ops`` operation replays as recorded (or as its handler's
``rebuild_op`` re-creates it, e.g. a split at moved indices), readers of a
residual stream get a :class:`~keras_precrop.layers.ChannelSlice` in front,
and an ``Add`` whose inputs end up with different widths becomes a
:class:`~keras_precrop.layers.PrefixAdd`. Layer names are preserved; nested
models are rebuilt as nested models.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_precrop.graph import layers as _layers
from keras_precrop.graph.channels import channels_width
from keras_precrop.graph.walker import ModelGraph, functional_of, topological_nodes


class _Rebuilder:
    """Holds the state of one rebuild: new layers and tensors by old id."""

    def __init__(self, graph: ModelGraph, widths, timing=False):
        self.graph = graph
        self.widths = np.asarray(widths)
        self.timing = timing
        self.new_ops = {}
        self.calls = {}
        self.names = graph.layer_names()

    def width(self, seg):
        """New width of a segment's group."""
        return self.graph.new_width(seg, self.widths)

    def model(self, fn, tensors):
        """Replay functional ``fn`` on ``tensors`` (old id -> new tensor)."""
        for node in topological_nodes(fn):
            op = node.operation
            if isinstance(op, keras.layers.InputLayer):
                continue
            args, kwargs = node.arguments.fill_in(tensors)
            new_op = self._new_op(op)
            if isinstance(op, keras.Model):
                outs = new_op(*args, **kwargs)
            else:
                rec = self.graph.record(op)
                call = self.calls.get(id(op), 0)
                self.calls[id(op)] = call + 1
                args = self._slice_readers(rec, call, args)
                if isinstance(op, (keras.layers.Add, _layers.PrefixAdd)):
                    new_op = self._merge(op, rec)
                outs = new_op(*args, **kwargs)
            for t, new in zip(node.outputs, keras.tree.flatten(outs)):
                tensors[id(t)] = new
        return keras.tree.map_structure(lambda t: tensors[id(t)], fn._outputs_struct)

    def _new_op(self, op):
        """The rebuilt counterpart of ``op`` (created once, then shared)."""
        if id(op) in self.new_ops:
            return self.new_ops[id(op)]
        if isinstance(op, keras.Model):
            new = self._nested(op)
        elif isinstance(op, keras.layers.Layer):
            rec = self.graph.record(op)
            config = rec.handler.configure(rec, op.get_config(), self.width)
            if self.timing:
                config = _timing_initializers(config)
            new = type(op).from_config({**config, "name": self.graph.traced.name(op)})
        else:  # a stateless keras.ops operation: as recorded, unless its handler re-creates it
            rec = self.graph.record(op)
            new = rec.handler.rebuild_op(rec, op, self.width)
        self.new_ops[id(op)] = new
        return new

    def _nested(self, model):
        """Rebuild a nested Functional/Sequential model with its own inputs."""
        fn = functional_of(model)
        tensors, inputs = {}, []
        for t in fn.inputs:
            seg_channels = self._new_width_of_old_tensor(t)
            x = keras.Input(shape=tuple(t.shape[1:-1]) + (seg_channels,),
                            dtype=t.dtype, name=t.name)
            tensors[id(t)] = x
            inputs.append(x)
        outputs = self.model(fn, tensors)
        return keras.Model(inputs if len(inputs) > 1 else inputs[0], outputs,
                           name=self.graph.traced.name(model))

    def _new_width_of_old_tensor(self, t):
        channels = self.graph.tensor_channels[id(t)]
        return channels_width(channels, self.width)

    def _slice_readers(self, rec, call, args):
        """Put a ChannelSlice in front of a reader whose view is narrower."""
        if not rec.read_segments:
            return args
        channels = rec.inputs[call][0]
        view = self.graph.view(rec, channels[0].segment)
        if len(channels) != 1 or view is None:
            return args
        width = int(self.widths[view]) * self.graph.scale(channels[0].segment)
        x = args[0]
        if width >= x.shape[-1]:
            return args
        name = self._unique(f"{self.graph.traced.name(rec.layer)}_slice")
        return (_layers.ChannelSlice(width, name=name)(x),) + tuple(args[1:])

    def _merge(self, op, rec):
        """An Add whose inputs differ in width (in any of its calls) becomes a PrefixAdd.

        One for all its calls: a shared Add (keras_hub's feature pyramid adds
        every level with one ``merge_op``) stays one layer.
        """
        key = ("merge", id(op))
        if key not in self.new_ops:
            differ = any(len({channels_width(ch, self.width) for ch in ins}) > 1
                         for ins in rec.inputs)
            self.new_ops[key] = (_layers.PrefixAdd(name=self.graph.traced.name(op)) if differ
                                 else self.new_ops[id(op)])
        return self.new_ops[key]

    def _unique(self, name):
        base, i = name, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name


class _TimingInitializer(keras.initializers.Initializer):
    """LeCun-normal values drawn by NumPy, for a model that is only timed.

    Under JAX each new shape's ``jax.random`` draw compiles (about 0.5 s per
    kernel, most of a rebuild's time); a model built to be timed needs values
    that are finite, nonzero and of a sane scale, not the seeded draw.
    """

    def __call__(self, shape, dtype=None):
        fan_in = max(1, int(np.prod(shape[:-1])))
        values = np.random.default_rng(len(shape)).standard_normal(shape) / np.sqrt(fan_in)
        return keras.ops.convert_to_tensor(values, dtype=dtype or "float32")


def _timing_initializers(config):
    """``config`` with every random initializer (one with a ``seed``) replaced by a NumPy draw."""
    def swap(value):
        init = keras.initializers.get(value)
        return _TimingInitializer() if hasattr(init, "seed") else value

    return {key: swap(value) if key.endswith("_initializer") and value is not None else value
            for key, value in config.items()}


def rebuild(graph: ModelGraph, widths, *, timing=False) -> keras.Model:
    """A freshly initialized copy of ``graph.model`` with new widths.

    Args:
        graph: the walked model.
        widths: integer width of every variable of ``graph.variables``.
        timing: the copy is only timed (latency models): random initializers
            are replaced by a NumPy draw of the same scale, which under JAX
            builds several times faster (no compile per kernel shape).
    """
    fn = graph.functional
    builder = _Rebuilder(graph, widths, timing)
    tensors = {}
    for t in fn.inputs:
        tensors[id(t)] = keras.Input(shape=tuple(t.shape[1:]), dtype=t.dtype,
                                     name=t._keras_history.operation.name)
    inputs = keras.tree.map_structure(lambda t: tensors[id(t)], fn._inputs_struct)
    outputs = builder.model(fn, tensors)
    return keras.Model(inputs, outputs, name=graph.model.name)
