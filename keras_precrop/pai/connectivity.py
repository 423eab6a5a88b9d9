"""Channel-level connectivity of masked CNNs: detached weights and channel groups.

A masked weight is *detached* when no path of unmasked weights joins it to
both the model input and the model output; it then never affects a
prediction but still counts as a kept parameter (Vysogorets & Kempe, 2021,
whose removal the PreCrop paper follows in its granularity experiment).
:func:`remove_detached` finds them by propagating, per channel, "reached from
the input" forward and "reaches the output" backward through the masks in
graph order.

Limits (each raises ``ValueError`` naming the layer rather than guessing):

* Functional or Sequential models (nested ones are walked in place) whose
  layers are conv/dense/depthwise/separable, BatchNormalization, element-wise
  and pooling layers, ``Add``/``Subtract``/``Average``/``Maximum``/``Minimum``,
  ``Concatenate`` on the channel axis and ``Flatten``; ``Multiply`` (e.g.
  squeeze-excite gates), ``Reshape`` and other layers are not supported.
* channels_last layouts only; a grouped convolution connects each group's
  inputs to that group's outputs (a block-diagonal channel matrix).
* Connectivity is tracked per channel, not per spatial position, and biases
  or BN shifts (constant signals) do not make a channel "reached": a masked
  bias is kept when its channel reaches the output.
"""

import dataclasses

import keras
import numpy as np

from keras_precrop.pai import common

_L = keras.layers
# Layers whose output channel c depends on input channel c only.
_CHANNELWISE = (
    _L.ReLU, _L.LeakyReLU, _L.PReLU, _L.ELU, _L.Activation, _L.Dropout, _L.SpatialDropout1D,
    _L.SpatialDropout2D, _L.SpatialDropout3D, _L.GaussianDropout, _L.GaussianNoise,
    _L.AlphaDropout, _L.ActivityRegularization, _L.MaxPooling1D, _L.MaxPooling2D,
    _L.MaxPooling3D, _L.AveragePooling1D, _L.AveragePooling2D, _L.AveragePooling3D,
    _L.GlobalAveragePooling1D, _L.GlobalAveragePooling2D, _L.GlobalAveragePooling3D,
    _L.GlobalMaxPooling1D, _L.GlobalMaxPooling2D, _L.GlobalMaxPooling3D, _L.ZeroPadding1D,
    _L.ZeroPadding2D, _L.ZeroPadding3D, _L.Cropping1D, _L.Cropping2D, _L.Cropping3D,
    _L.UpSampling1D, _L.UpSampling2D, _L.UpSampling3D, _L.Identity, _L.Rescaling,
    _L.BatchNormalization,
)
_MERGE = (_L.Add, _L.Subtract, _L.Average, _L.Maximum, _L.Minimum)


@dataclasses.dataclass
class Step:
    """One layer call: the layer, its kind and its input/output tensor ids."""

    layer: keras.layers.Layer
    kind: str  # "kernel", "channelwise", "mix", "merge", "concat", "flatten"
    inputs: list
    outputs: list


@dataclasses.dataclass
class Graph:
    """Layer calls in topological order plus each tensor's channel count."""

    steps: list
    channels: dict  # tensor id -> number of channels (last axis)
    inputs: list
    outputs: list
    flatten_repeats: dict  # tensor id of a Flatten output -> spatial size


def _is_softmax(layer):
    return isinstance(layer, _L.Softmax) or getattr(layer, "activation", None) is keras.activations.softmax


def _kind(layer, where):
    if common.weight_specs(layer) and not isinstance(layer, _L.BatchNormalization):
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            raise ValueError(f"{where}: only channels_last layers are supported.")
        return "kernel"
    if _is_softmax(layer):
        return "mix"
    if isinstance(layer, _CHANNELWISE):
        if getattr(layer, "data_format", "channels_last") not in ("channels_last", None):
            raise ValueError(f"{where}: only channels_last layers are supported.")
        return "channelwise"
    if isinstance(layer, _MERGE):
        return "merge"
    if isinstance(layer, _L.Concatenate):
        return "concat"
    if isinstance(layer, _L.Flatten):
        return "flatten"
    raise ValueError(
        f"{where}: layers of class {type(layer).__name__} are not supported by the "
        "channel connectivity analysis (remove_detached, channel-granular random "
        "masks); supported are conv/dense layers, BatchNormalization, element-wise, "
        "pooling, padding, Add-like merges, Concatenate and Flatten."
    )


def _functional(model):
    if isinstance(model, keras.Sequential):
        model = getattr(model, "_functional", None) or model
    if not hasattr(model, "_nodes_by_depth"):
        raise ValueError(
            f"Model {model.name!r} ({type(model).__name__}) is not a built Functional or "
            "Sequential model, so its channel connectivity cannot be read."
        )
    return model


def walk(model):
    """Reads ``model``'s layer calls in topological order into a :class:`Graph`.

    Raises:
        ValueError: for unsupported models or layers (see the module docstring).
    """
    fn = _functional(model)
    graph = Graph([], {}, [id(t) for t in fn.inputs], [], {})
    alias = {}
    for t in fn.inputs:
        graph.channels[id(t)] = int(t.shape[-1])
    _walk_into(fn, graph, alias)
    graph.outputs = [alias.get(id(t), id(t)) for t in fn.outputs]
    return graph


def _walk_into(fn, graph, alias):
    """Appends the steps of functional ``fn``; ``alias`` maps inner tensor ids to outer ones."""
    for depth in sorted(fn._nodes_by_depth, reverse=True):
        for node in fn._nodes_by_depth[depth]:
            layer = node.operation
            if isinstance(layer, _L.InputLayer):
                continue
            ins = [alias.get(id(t), id(t)) for t in node.arguments.keras_tensors]
            if isinstance(layer, keras.Model):
                inner = _functional(layer)
                for t_in, outer in zip(inner.inputs, ins):
                    alias[id(t_in)] = outer
                _walk_into(inner, graph, alias)
                for t_out, t_inner in zip(node.outputs, inner.outputs):
                    alias[id(t_out)] = alias.get(id(t_inner), id(t_inner))
                continue
            where = f"layer {layer.name!r}"
            kind = _kind(layer, where)
            outs = [id(t) for t in node.outputs]
            for t in node.outputs:
                graph.channels[id(t)] = int(t.shape[-1])
            if kind == "concat" and layer.axis not in (-1, len(node.outputs[0].shape) - 1):
                raise ValueError(f"{where}: only concatenation on the channel (last) axis is supported.")
            if kind == "flatten":
                in_shape = node.arguments.keras_tensors[0].shape
                graph.flatten_repeats[outs[0]] = int(np.prod(in_shape[1:-1]))
            graph.steps.append(Step(layer, kind, ins, outs))


# -- masks of a kernel layer as channel connection matrices -----------------


def _layer_masks(layer, masks):
    """``{variable name: (spec, bool mask, path)}`` of a layer's maskable weights (ones if unmasked)."""
    specs = common.weight_specs(layer)
    return {
        v.name: (specs[v.name], np.asarray(masks.get(v.path, np.ones(v.shape)), bool), v.path)
        for v in layer.weights
        if v.name in specs
    }


def _connections(spec, mask):
    """Boolean (in, out) matrix: is any weight between the two channels kept.

    For a depthwise kernel the matrix is (in, multiplier).
    """
    moved = np.moveaxis(mask, (spec.in_axis, spec.out_axis), (-2, -1))
    conn = moved.reshape(-1, *moved.shape[-2:]).any(axis=0)
    return common.block_diagonal(conn, spec.groups) if spec.groups > 1 else conn


def _kernels(layer, masks):
    """The (spec, mask, path) of the kernels a layer applies, in order."""
    weights = _layer_masks(layer, masks)
    return [weights[n] for n in ("kernel", "depthwise_kernel", "pointwise_kernel") if n in weights]


def _forward_kernel(spec, mask, alive):
    conn = _connections(spec, mask)
    if spec.kind == "depthwise":
        return (alive[:, None] & conn).ravel()
    return (alive[:, None] & conn).any(axis=0)


def _backward_kernel(spec, mask, useful):
    conn = _connections(spec, mask)
    if spec.kind == "depthwise":
        return (conn & useful.reshape(conn.shape)).any(axis=1)
    return (conn & useful[None, :]).any(axis=1)


def _keep_kernel(spec, mask, alive, useful):
    """The mask with weights whose input is unreached or output useless removed."""
    rows = np.asarray(alive)[:, None]
    cols = useful.reshape(-1, mask.shape[spec.out_axis]) if spec.kind == "depthwise" else useful[None, :]
    keep = rows & cols
    if spec.groups > 1:
        keep = common.group_local(keep, spec.groups)
    return mask & common.spread(spec, keep, mask.ndim)


def _channel_scale(layer, masks):
    """BN gamma mask as a channel filter (ones when gamma is not masked)."""
    if not isinstance(layer, _L.BatchNormalization) or not layer.scale:
        return None
    path = layer.gamma.path
    return np.asarray(masks[path], bool) if path in masks else None


def remove_detached(model, masks):
    """Returns ``masks`` with the weights that no longer join input to output removed.

    Args:
        model: the built model the masks belong to.
        masks: ``{weight path: 0/1 array}`` (e.g. from :func:`random_masks`).

    Returns:
        A new dict with the same keys; each mask keeps a subset of its ones.

    Raises:
        ValueError: for masks that do not fit the model, or a model outside
            the supported class (see the module docstring).
    """
    from keras_precrop.pai.masks import check_masks  # masks.py imports nothing from here

    checked = check_masks(model, masks)
    masks = {p: m for p, (_, _, _, m) in checked.items()}
    graph = walk(model)
    alive = {t: np.ones(graph.channels[t], bool) for t in graph.inputs}
    for step in graph.steps:
        out = _forward(step, [alive[t] for t in step.inputs], masks, graph)
        for t in step.outputs:
            alive[t] = out
    useful = {}
    for t in graph.outputs:
        useful[t] = np.ones(graph.channels[t], bool)
    kept = {p: np.zeros(m.shape, bool) for p, m in masks.items()}
    for step in reversed(graph.steps):
        out_useful = np.zeros(graph.channels[step.outputs[0]], bool)
        for t in step.outputs:
            out_useful |= useful.get(t, False)
        in_useful = _backward(step, [alive[t] for t in step.inputs], out_useful, masks, graph, kept)
        for t, u in zip(step.inputs, in_useful):
            useful[t] = useful.get(t, np.zeros(graph.channels[t], bool)) | u
    seen = {p for step in graph.steps for (_, _, p) in _layer_masks(step.layer, {}).values()}
    return {
        p: (kept[p] if p in seen else np.asarray(m, bool)).astype(np.float32)
        for p, m in masks.items()
    }


def _forward(step, ins, masks, graph):
    """Channels of the step's output reached from the model input."""
    if step.kind == "kernel":
        alive = ins[0]
        for spec, mask, _ in _kernels(step.layer, masks):
            alive = _forward_kernel(spec, mask, alive)
        return alive if not _is_softmax(step.layer) else np.full(alive.shape, alive.any())
    if step.kind == "channelwise":
        scale = _channel_scale(step.layer, masks)
        return ins[0] if scale is None else ins[0] & scale
    if step.kind == "mix":
        return np.full(graph.channels[step.outputs[0]], ins[0].any())
    if step.kind == "merge":
        return np.logical_or.reduce(ins)
    if step.kind == "concat":
        return np.concatenate(ins)
    return np.tile(ins[0], graph.flatten_repeats[step.outputs[0]])  # flatten


def _backward(step, ins_alive, out_useful, masks, graph, kept):
    """Channels of each step input that reach the output; records kept weights."""
    layer = step.layer
    if step.kind == "kernel":
        kernels = _kernels(layer, masks)
        if _is_softmax(layer):
            out_useful = np.full(out_useful.shape, out_useful.any())
        # Forward alive of each kernel's input, then walk the kernels backwards.
        alive_in = [ins_alive[0]]
        for spec, mask, _ in kernels[:-1]:
            alive_in.append(_forward_kernel(spec, mask, alive_in[-1]))
        useful = out_useful
        for (spec, mask, path), alive in zip(reversed(kernels), reversed(alive_in)):
            if path in kept:
                kept[path] |= _keep_kernel(spec, mask, alive, useful)
            useful = _backward_kernel(spec, mask, useful)
        for spec, mask, path in _layer_masks(layer, masks).values():
            if spec.kind == "bias" and path in kept:
                kept[path] |= mask & out_useful
        return [useful]
    if step.kind == "channelwise":
        for spec, mask, path in _layer_masks(layer, masks).values():
            if path in kept:  # BN gamma needs a reached channel, beta only a useful one
                need = out_useful & ins_alive[0] if spec.kind == "scale" else out_useful
                kept[path] |= mask & need
        scale = _channel_scale(layer, masks)
        return [out_useful if scale is None else out_useful & scale]
    if step.kind == "mix":
        return [np.full(ins_alive[0].shape, out_useful.any())]
    if step.kind == "merge":
        return [out_useful for _ in ins_alive]
    if step.kind == "concat":
        return np.split(out_useful, np.cumsum([a.size for a in ins_alive])[:-1])
    repeats = graph.flatten_repeats[step.outputs[0]]
    return [out_useful.reshape(repeats, -1).any(axis=0)]  # flatten


# -- channel groups ----------------------------------------------------------


def channel_priorities(model, rng):
    """Random per-channel priorities shared by every tensor of a channel group.

    Tensors tied channel-by-channel (through BatchNorm, activations, pooling,
    multiplier-1 depthwise convs and residual ``Add`` merges) form one group
    and get one random permutation, so layers that keep their highest-priority
    channels keep nested, aligned channel sets: layer l's kept output channels
    are the ones layer l + 1 reads, as in PreCrop's channel pruning.

    Returns:
        ``{path: (input priorities, output priorities)}`` for each kernel of
        the model (for a separable conv the pointwise kernel's input is the
        depthwise output), priorities being float arrays, larger kept first.
    """
    graph = walk(model)
    parent = {}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def new(size):
        seg = len(parent)
        parent[seg] = seg
        sizes[seg] = size
        return [(seg, size)]

    def tie(a, b, where):
        if [s for _, s in a] != [s for _, s in b]:
            raise ValueError(f"{where}: merged tensors have differently built channel axes.")
        for (x, _), (y, _) in zip(a, b):
            parent[find(x)] = find(y)

    sizes = {}
    desc = {t: new(graph.channels[t]) for t in graph.inputs}
    layer_io = []  # (layer, input descriptor, output descriptor)
    for step in graph.steps:
        ins = [desc[t] for t in step.inputs]
        if step.kind == "kernel":
            kernels = _kernels(step.layer, {})
            spec = kernels[0][0]
            one_to_one = (spec.kind == "depthwise" and step.layer.depth_multiplier == 1) or (
                spec.groups > 1 and spec.groups == graph.channels[step.inputs[0]] == step.layer.filters)
            if len(kernels) == 1 and one_to_one:
                out = ins[0]
            else:
                out = new(graph.channels[step.outputs[0]])
            layer_io.append((step.layer, ins[0], out))
        elif step.kind == "channelwise":
            out = ins[0]
        elif step.kind == "mix":
            out = new(graph.channels[step.outputs[0]])
        elif step.kind == "merge":
            for other in ins[1:]:
                tie(ins[0], other, f"layer {step.layer.name!r}")
            out = ins[0]
        elif step.kind == "concat":
            out = [part for d in ins for part in d]
        else:  # flatten
            out = ins[0] * graph.flatten_repeats[step.outputs[0]]
        for t in step.outputs:
            desc[t] = out
    ranks = {}

    def priority(d):
        parts = []
        for seg, size in d:
            root = find(seg)
            if root not in ranks:
                ranks[root] = rng.permutation(sizes[root]).astype(np.float64)
            parts.append(ranks[root])
        return np.concatenate(parts)

    out = {}
    for layer, d_in, d_out in layer_io:
        p_in, p_out = priority(d_in), priority(d_out)
        for spec, mask, path in _kernels(layer, {}):
            if spec.kind == "depthwise":
                multiplier = mask.shape[spec.out_axis]
                out[path] = (p_in, None)
                p_in = np.repeat(p_in, multiplier)
            else:
                out[path] = (p_in, p_out)
        for spec, _, path in _layer_masks(layer, {}).values():
            if spec.kind == "bias":
                out[path] = (None, p_out)
    return out
