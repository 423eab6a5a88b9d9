"""Rebuild a functional model with new channel widths (fresh weights).

The rebuild replays the walked graph node by node, the way
``keras.models.clone_model`` does, but every layer is re-created from its
config with the widths a plan chose (``filters``/``units``/...), a stateless
``keras.ops`` operation replays as recorded (or as its handler's
``rebuild_op`` re-creates it, e.g. a split at moved indices), readers of a
residual stream get a :class:`~keras_precrop.layers.ChannelSlice` in front,
and an ``Add`` whose inputs end up with different widths becomes a
:class:`~keras_precrop.layers.PrefixAdd`. Layer names are preserved; nested
models are rebuilt as nested models. A layer whose class cannot re-create
itself from its own config (three keras_hub 0.32 classes) is re-created by a
repair, checked against the original (:mod:`keras_precrop.graph._hub_repairs`);
any other such layer is refused by name.

A ``seed`` fixes the rebuild's random draws without touching Keras' global
random state: every random initializer and every random layer's own ``seed``
(``Dropout``, ``GaussianNoise``) that the original left unseeded gets a seed
derived from ``seed`` and the layer's position in the walk. Seeds the user
gave a layer are kept. Without ``seed`` they draw as Keras draws them (from
its global state, which ``keras.utils.set_random_seed`` fixes).
"""

from __future__ import annotations

import copy

import keras
import numpy as np

from keras_precrop.errors import ArgumentError, UnsupportedModelError
from keras_precrop.graph import _hub_repairs
from keras_precrop.graph import layers as _layers
from keras_precrop.graph import replay as _replay
from keras_precrop.graph.channels import channels_width
from keras_precrop.graph.walker import ModelGraph

# What a get_config that cannot write its class's config raises; it may read an attribute its
# constructor never set (keras_hub 0.32's LlamaTransformerDecoder: rope_scaling_factor).
_CONFIG_ERRORS = (TypeError, ValueError, NotImplementedError, AttributeError, KeyError)


def layer_from_config(layer, config):
    """A new layer of ``layer``'s class from ``config``; a ``Lambda`` keeps its function object.

    Keras deserializes a ``Lambda``'s Python function only in its unsafe mode,
    which would also let any ``.keras`` file loaded later run code. The copy
    needs no deserializing: it takes the function (and a callable output shape
    or mask, and the arguments) from the layer itself, and Keras' safe mode is
    left as it was.
    """
    return _from_config(layer, config, layer.name)


def layer_copy(layer):
    """A new layer of ``layer``'s class from its own config, or an error naming the layer where
    the class cannot write or read it.

    No repair (:mod:`._hub_repairs`) makes the copy: a repair is trusted only once a twin matches
    the original on inputs of the original's sizes (:meth:`_Rebuilder._layer`), and a copy at
    other sizes would later be checked against a twin of itself, the same repair on both sides.
    """
    try:
        config = layer.get_config()
    except _CONFIG_ERRORS as err:
        raise _not_recreatable(layer, layer.name, "write its own config", err) from err
    return _from_config(layer, config, layer.name)


def _from_config(layer, config, name):
    """:func:`layer_from_config`, refusing as layer ``name`` (the user's name for it) a class whose
    ``from_config`` cannot read ``config``."""
    if isinstance(layer, keras.layers.Lambda):
        config = {**config, "function": layer.function, "output_shape": layer._output_shape,
                  "mask": layer.mask, "arguments": layer.arguments}
        return super(keras.layers.Lambda, type(layer)).from_config(config)
    try:
        return type(layer).from_config(config)
    except (TypeError, ValueError) as err:  # a class whose get_config does not re-create it
        raise _not_recreatable(layer, name, "be re-created from its own config", err) from err


def _config_of(layer, name):
    """``layer.get_config()``, or the config a repair writes (keras_hub 0.32's Swin
    ``PatchEmbedding`` raises ``TypeError`` there, see :mod:`._hub_repairs`), and whether a repair
    wrote it; an error naming the layer (as ``name``) where nothing writes it."""
    try:
        return layer.get_config(), False
    except _CONFIG_ERRORS as err:
        config = _hub_repairs.written_config(layer)
        if config is None:
            raise _not_recreatable(layer, name, "write its own config", err) from err
        return config, True


def _recreated(layer, config, name):
    """A new layer of ``layer``'s class from ``config``, by a repair (:mod:`._hub_repairs`) where
    its class cannot read it, and whether a repair made it."""
    try:
        return _from_config(layer, config, name), False
    except UnsupportedModelError:
        new = _hub_repairs.created(layer, config)
        if new is None:
            raise
        return new, True


def _pin_config(layer, config):
    """Make ``layer`` save the config it was created from, where its class writes another.

    A handler may leave out what a class's ``get_config`` writes but its constructor refuses,
    or add what it forgets (keras_hub 0.32's ``ViTPatchingAndEmbedding`` writes
    ``num_patches`` and forgets ``use_patch_bias``): the layer is then created, but saved
    with its class's config a ``.keras`` file could not load it (or would load another layer).
    Such a layer's ``get_config`` returns a copy of ``config``, which created it, so the
    saved model loads with the layer's own class; any other layer is left as it is.
    """
    if set(layer.get_config()) != set(config):
        layer.get_config = lambda: copy.deepcopy(config)


def _not_recreatable(layer, name, what, err):
    """The :class:`UnsupportedModelError` of a layer the rebuild cannot re-create: it cannot
    ``what``, for the reason ``err`` (an exception, or a sentence)."""
    reason = (f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
              if isinstance(err, Exception) else err)
    return UnsupportedModelError(
        f"Layer {name!r} of class {type(layer).__name__} cannot {what} ({reason}), and a pruned "
        "model is built from its layers' configs, the layers kept whole too. Give the class a "
        "get_config() that its constructor takes (the keras.layers.Layer contract), or keep the "
        "composite layer around it whole with ignore=[its name].")


class _Rebuilder:
    """Holds the state of one rebuild: new layers and tensors by old id."""

    def __init__(self, graph: ModelGraph, widths, timing=False, seed=None):
        self.graph = graph
        self.widths = np.asarray(widths)
        self.timing = timing
        self.seed = seed
        self.positions = {id(rec.layer): i for i, rec in enumerate(graph.layers)}
        self.new_ops = {}
        self.calls = {}
        self.names = graph.layer_names()

    def width(self, seg):
        """New width of a segment's group."""
        return self.graph.new_width(seg, self.widths)

    def model(self, fn, tensors):
        """Replay functional ``fn`` on ``tensors`` (old id -> new tensor); its new outputs."""
        outputs = _replay.replay(fn, tensors, self._call)
        return keras.tree.pack_sequence_as(fn._outputs_struct, outputs)

    def _call(self, node, inputs):
        """The new tensors of one call ``node`` of the original graph, on new ``inputs``."""
        op = node.operation
        args, kwargs = _replay.arguments(node, inputs)
        new_op = self._new_op(op, node)
        if not isinstance(op, keras.Model):
            rec = self.graph.record(op)
            call = self.calls.get(id(op), 0)
            self.calls[id(op)] = call + 1
            args = self._slice_readers(rec, call, args)
            if isinstance(op, (keras.layers.Add, _layers.PrefixAdd)):
                new_op = self._merge(op, rec)
        return keras.tree.flatten(new_op(*args, **kwargs))

    def _new_op(self, op, node):
        """The rebuilt counterpart of ``op``, called as ``node`` (created once, then shared)."""
        if id(op) in self.new_ops:
            return self.new_ops[id(op)]
        if isinstance(op, keras.Model):
            new = self._nested(op)
        elif isinstance(op, keras.layers.Layer):
            new = self._layer(op, node)
        else:  # a stateless keras.ops operation: as recorded, unless its handler re-creates it
            rec = self.graph.record(op)
            new = rec.handler.rebuild_op(rec, op, self.width)
            if new is op:  # a copy: op's call nodes would tie the new model to the original's tensors
                new = copy.copy(op)
                new._inbound_nodes, new._outbound_nodes = [], []
        self.new_ops[id(op)] = new
        return new

    def _layer(self, op, node):
        """Layer ``op`` re-created from its config with the plan's widths.

        Where a repair (:mod:`._hub_repairs`) wrote its config or re-created it,
        a twin made the same way from ``op``'s own config must be ``op``'s
        equal (checked on random inputs of ``node``'s shapes), or the layer is
        refused by name.
        """
        rec, name = self.graph.record(op), self.graph.traced.name(op)
        own, written = _config_of(op, name)
        config = rec.handler.configure(rec, own, self.width)
        if self.timing:
            config = _timing_initializers(config)
        elif self.seed is not None:
            config = _seeded(config, np.random.SeedSequence([self.seed, self.positions[id(op)]]))
        config = {**config, "name": name}
        new, created = _recreated(op, config, name)
        if written or created:
            problem = self._repair_problem(op, name, node)
            if problem:
                what = "write its own config" if written else "be re-created from its own config"
                raise _not_recreatable(op, name, f"{what}, nor by keras_precrop's repair of its "
                                       "class", problem)
        else:
            _pin_config(new, config)
        return new

    def _repair_problem(self, op, name, node):
        """What tells ``op`` from a repair's twin of it made from its own config (``None``:
        nothing), checked once per walk: every rebuild of the walk (a latency model's variants)
        repairs it the same way."""
        checked = self.graph.repairs_checked
        if id(op) not in checked:
            twin, _ = _recreated(op, {**_config_of(op, name)[0], "name": name}, name)
            checked[id(op)] = _hub_repairs.difference(op, twin, node.arguments)
        return checked[id(op)]

    def _nested(self, model):
        """Rebuild a nested Functional/Sequential model with its own inputs."""
        fn = self.graph.traced.graph_of(model)
        tensors, inputs = {}, []
        for t in fn.inputs:
            seg_channels = self._new_width_of_old_tensor(t)
            x = keras.Input(shape=tuple(t.shape[1:-1]) + (seg_channels,), dtype=t.dtype,
                            name=t._keras_history.operation.name)  # its InputLayer's: ignore= may name it
            tensors[id(t)] = x
            inputs.append(x)
        outputs = self.model(fn, tensors)
        return keras.Model(keras.tree.pack_sequence_as(fn._inputs_struct, inputs), outputs,
                           name=self.graph.traced.name(model))  # a dict of inputs stays one

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
        sliced = _layers.ChannelSlice(width, name=name, dtype=rec.layer.dtype_policy.name)(x)
        return (sliced,) + tuple(args[1:])

    def _merge(self, op, rec):
        """An Add whose inputs differ in width (in any of its calls) becomes a PrefixAdd.

        One for all its calls: a shared Add (keras_hub's feature pyramid adds
        every level with one ``merge_op``) stays one layer.
        """
        key = ("merge", id(op))
        if key not in self.new_ops:
            differ = any(len({channels_width(ch, self.width) for ch in ins}) > 1
                         for ins in rec.inputs)
            policy = op.dtype_policy.name  # the replaced Add's, not the global policy of now
            self.new_ops[key] = (_layers.PrefixAdd(name=self.graph.traced.name(op), dtype=policy)
                                 if differ else self.new_ops[id(op)])
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


def _seeded(config, sequence):
    """``config`` with each unseeded random draw seeded from ``sequence`` (one layer's seeds).

    The draws are the random initializers (``*_initializer``) and the
    layer's own ``seed`` (random layers); each gets its own stream, in the
    order of the config's keys.
    """
    keys = sorted(key for key, value in config.items()
                  if (key == "seed" and value is None) or _unseeded_initializer(key, value))
    seeds = dict(zip(keys, (int(s) >> 1 for s in sequence.generate_state(max(len(keys), 1)))))
    out = dict(config)
    for key, seed in seeds.items():
        if key == "seed":
            out[key] = seed
        else:
            value = keras.initializers.serialize(config[key]) if isinstance(
                config[key], keras.initializers.Initializer) else config[key]
            out[key] = {**value, "config": {**value["config"], "seed": seed}}
    return out


def _unseeded_initializer(key, value):
    """Whether config entry ``key: value`` is a random initializer without a seed of its own.

    An initializer object is read through its config, never called or
    re-created, so that no draw from Keras' global random state happens.
    """
    if not key.endswith("_initializer"):
        return False
    if isinstance(value, keras.initializers.Initializer):
        value = keras.initializers.serialize(value)
    config = value.get("config") if isinstance(value, dict) else None
    return isinstance(config, dict) and "seed" in config and config["seed"] is None


def random_layers(graph):
    """Names of ``graph``'s layers that draw at random of their own (dropout, noise) without a seed.

    A rebuild's ``seed`` seeds them (see :func:`_seeded`), whatever weights
    the rebuilt model is then given.
    """
    return [rec.path for rec in graph.layers if isinstance(rec.layer, keras.layers.Layer)
            and not isinstance(rec.layer, keras.Model)
            and "seed" in (config := rec.layer.get_config()) and config["seed"] is None]


def check_seed(seed):
    """``seed`` as given (``None`` or an integer >= 0); anything else raises.

    Raises:
        ArgumentError: naming ``seed``.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise ArgumentError("{seed} must be None (draw from Keras' global random state) or an "
                            "integer >= 0.", seed=seed)
    return seed


def rebuild(graph: ModelGraph, widths, *, timing=False, seed=None) -> keras.Model:
    """A freshly initialized copy of ``graph.model`` with new widths.

    Args:
        graph: the walked model.
        widths: integer width of every variable of ``graph.variables``.
        timing: the copy is only timed (latency models): random initializers
            are replaced by a NumPy draw of the same scale, which under JAX
            builds several times faster (no compile per kernel shape).
        seed: ``None`` draws the fresh weights as Keras does; an integer
            seeds every unseeded random initializer and random layer from it
            and the layer's position, leaving Keras' global random state as it
            was (see the module docstring).
    """
    fn = graph.functional
    builder = _Rebuilder(graph, widths, timing, check_seed(seed))
    tensors = {}
    for t in fn.inputs:
        tensors[id(t)] = keras.Input(shape=tuple(t.shape[1:]), dtype=t.dtype,
                                     name=t._keras_history.operation.name)
    inputs = keras.tree.map_structure(lambda t: tensors[id(t)], fn._inputs_struct)
    outputs = builder.model(fn, tensors)
    return keras.Model(inputs, outputs, name=graph.model.name)
