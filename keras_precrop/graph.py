"""Walking a Keras functional graph into channel groups and bilinear costs.

The walker visits every node of a functional model in topological order
(nested Functional and Sequential models are walked in place) and asks the
handler registered for each layer class (see ``handlers.py``) how channels
flow through it. The result, a :class:`ModelGraph`, holds:

* **segments**: channel axes whose widths must be equal, kept in a union-find;
  a merged set is a *group*.
* **cost terms**: ``coef * w_a * w_b`` contributions to parameters and MACs,
  where ``w_a``, ``w_b`` are group widths (or 1). Every supported layer's
  parameter count and MAC count is a sum of such terms, so one cost model
  serves profiling, solving and predicting the rebuilt model.
* **objective entries**: for each prunable kernel, the groups whose log width
  ratios add up to the log of its density (the SynExp objective).
* **residual structure**: element-wise merges (``Add``) recorded as edges, so
  that :meth:`ModelGraph.variables` can either tie everything on a residual
  stream to one width (``residual="tie"``) or give each layer that reads from
  or writes into the stream its own width bounded by the stream's
  (``residual="prefix"``, the paper's PreCrop rule).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable

import keras


class UnsupportedModelError(ValueError):
    """The model cannot be analysed (subclassed, undefined shapes, ...)."""


class UnsupportedLayerError(ValueError):
    """A layer's channel semantics are unknown to the walker."""


@dataclasses.dataclass(frozen=True)
class Part:
    """A contiguous block of ``mult * width(group)`` channels of a tensor."""

    group: int
    mult: int = 1


Channels = tuple  # tuple[Part, ...]: a tensor's channel axis, in order


@dataclasses.dataclass
class Term:
    """``params * w_a * w_b`` parameters and ``macs * w_a * w_b`` MACs.

    ``a`` and ``b`` are segment ids, or ``None`` for a factor of one. The
    coefficients are per channel, so at the original widths the term's value
    is ``coef * C_a * C_b``.
    """

    params: float
    macs: float
    a: int | None = None
    b: int | None = None


@dataclasses.dataclass
class LayerRecord:
    """What the walker learned about one layer (over all of its calls)."""

    layer: keras.layers.Layer
    path: str
    handler: object  # the handlers.Handler that walks and configures it
    ignored: bool = False
    calls: int = 0
    inputs: list = dataclasses.field(default_factory=list)  # Channels per call
    outputs: list = dataclasses.field(default_factory=list)  # Channels per call
    terms: list = dataclasses.field(default_factory=list)
    objective: list = dataclasses.field(default_factory=list)  # [(weight, seg)]
    out_segment: int | None = None  # the segment a source layer creates
    readers: list = dataclasses.field(default_factory=list)  # segments read

    @property
    def class_name(self):
        return type(self.layer).__name__


@dataclasses.dataclass
class _Segment:
    width: int
    name: str
    depth: int
    fixed: bool = False


class WalkContext:
    """The state handlers read and write while the graph is walked."""

    def __init__(self, residual):
        self.residual = residual
        self.segments: list[_Segment] = []
        self._parent: list[int] = []
        self.merges: list[tuple[int, list[int], str]] = []  # (out, ins, where)
        self.leq: list[tuple[int, int]] = []  # width(a) <= width(b)
        self.multiples: list[tuple[LayerRecord, int, int]] = []  # (reader, seg, m)
        self.records: dict[int, LayerRecord] = {}
        self.order: list[LayerRecord] = []
        self.depth = 0  # depth of the node being walked
        self.notes: list[str] = []  # decisions a user should know about

    # -- union-find over segments -------------------------------------------
    def new_segment(self, width, name, fixed=False):
        """Create a channel axis of ``width`` channels; returns its id."""
        self.segments.append(_Segment(int(width), name, self.depth, fixed))
        self._parent.append(len(self._parent))
        return len(self._parent) - 1

    def find(self, s):
        """The representative segment of ``s``'s group."""
        root = s
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[s] != root:
            self._parent[s], s = root, self._parent[s]
        return root

    def union(self, a, b, where):
        """Tie two segments to one width; ``where`` names the layer for errors."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        sa, sb = self.segments[ra], self.segments[rb]
        if sa.width != sb.width:
            raise UnsupportedLayerError(
                f"{where}: cannot couple channel axes of different widths "
                f"({sa.name}: {sa.width} vs {sb.name}: {sb.width})."
            )
        # The older (shallower, then earlier) segment names the group.
        if (sb.depth, rb) < (sa.depth, ra):
            ra, rb, sa, sb = rb, ra, sb, sa
        self._parent[rb] = ra
        sa.fixed = sa.fixed or sb.fixed
        return ra

    def tie(self, a: Channels, b: Channels, where):
        """Tie two channel descriptors part by part.

        Descriptors built differently (a concatenation against a plain tensor,
        say a squeeze-excite gate on concatenated features) cannot be tied
        part by part; their channels are kept fixed instead, with a note.
        """
        if len(a) != len(b) or any(p.mult != q.mult for p, q in zip(a, b)):
            if width_of(self, a) != width_of(self, b):
                raise UnsupportedLayerError(
                    f"{where}: cannot couple tensors of {width_of(self, a)} and "
                    f"{width_of(self, b)} channels. Pass "
                    f"ignore=[{where.split('/')[-1]!r}] to keep them fixed.")
            self.fix(a)
            self.fix(b)
            self.notes.append(
                f"{where}: couples a concatenation (or depthwise-multiplied "
                "tensor) with a differently built tensor; those channels are "
                "kept fixed.")
            return
        for p, q in zip(a, b):
            self.union(p.group, q.group, where)

    def multiple_of(self, rec, channels: Channels, m):
        """Require each part of ``channels``, as ``rec`` sees it, to stay a multiple of ``m``.

        Grouped convolutions and group normalization keep their group count,
        so their channel counts move in multiples of it.
        """
        for p in channels:
            need = m // math.gcd(m, p.mult)
            if need > 1:
                self.multiples.append((rec, p.group, need))

    def fix(self, channels: Channels):
        """Mark every group of a descriptor as not prunable."""
        for p in channels:
            self.segments[self.find(p.group)].fixed = True

    # -- costs ----------------------------------------------------------------
    def add_term(self, rec, params, macs, a=None, b=None):
        """Add ``coef * width(a) * width(b)``; ``a``/``b`` are Parts or None."""
        coef = 1
        segs = []
        for p in (a, b):
            if p is not None:
                coef *= p.mult
                segs.append(p.group)
        segs += [None] * (2 - len(segs))
        rec.terms.append(Term(params * coef, macs * coef, segs[0], segs[1]))

    def add_kernel(self, rec, *factors: Channels):
        """Declare a prunable kernel whose density is the product of factors.

        A factor with several parts (a concatenation) contributes the
        width-weighted mean of its parts' log ratios, a concave lower bound
        of its true log ratio that keeps the program convex.
        """
        for channels in factors:
            total = sum(p.mult * self.segments[p.group].width for p in channels)
            for p in channels:
                weight = p.mult * self.segments[p.group].width / total
                rec.objective.append((weight, p.group))


def width_of(ctx, channels: Channels):
    """Original number of channels described by ``channels``."""
    return sum(p.mult * ctx.segments[p.group].width for p in channels)


# ---------------------------------------------------------------------------
# The walk.


def _is_functional(model):
    return isinstance(model, keras.Model) and hasattr(model, "_nodes_by_depth")


def _functional_of(model):
    """The functional graph of a Functional or built Sequential model."""
    if isinstance(model, keras.Sequential):
        fn = getattr(model, "_functional", None)
        if fn is None:
            raise UnsupportedModelError(
                f"Sequential model {model.name!r} is not built: give it an "
                "Input (keras.Input(shape)) as first layer or call it once."
            )
        return fn
    if _is_functional(model):
        return model
    raise UnsupportedModelError(
        f"Model {getattr(model, 'name', model)!r} of class "
        f"{type(model).__name__} is not a functional or Sequential model; "
        "its channel flow cannot be read from a graph. Rebuild it with the "
        "functional API (keras.Input + layer calls + keras.Model)."
    )


def _topological_nodes(fn):
    """Nodes of a functional model, inputs first."""
    for depth in sorted(fn._nodes_by_depth, reverse=True):
        yield from fn._nodes_by_depth[depth]


@dataclasses.dataclass
class ModelGraph:
    """The walked graph: segments, layer records and residual merges."""

    model: keras.Model
    ctx: WalkContext
    residual: str
    tensor_channels: dict  # id(KerasTensor) -> Channels, nested models included

    @property
    def layers(self) -> list[LayerRecord]:
        return self.ctx.order

    @functools.cached_property
    def structure(self) -> "Structure":
        """Width variables under the residual mode (computed once)."""
        return _resolve(self)

    def find(self, seg):
        """Representative segment of ``seg``'s channel group."""
        return self.ctx.find(seg)


def walk(model, *, ignore: Iterable[str] = (), residual: str = "prefix"):
    """Walk ``model`` into a :class:`ModelGraph`.

    Args:
        model: a built functional or Sequential ``keras.Model`` with defined
            input shapes (batch dimension excepted).
        ignore: names (or ``outer/inner`` paths for nested models) of layers
            whose channels stay fixed; an ignored layer of an unsupported
            class is treated as an opaque block.
        residual: ``"prefix"`` (each reader/writer of a residual stream gets
            its own width) or ``"tie"`` (the whole stream shares one width).
    """
    from keras_precrop import handlers  # the registry imports this module

    if residual not in ("prefix", "tie"):
        raise ValueError(f"residual must be 'prefix' or 'tie', got {residual!r}")
    fn = _functional_of(model)
    ignore = set(ignore)
    known = set(_all_layer_names(fn, ""))
    missing = sorted(ignore - known)
    if missing:
        raise ValueError(
            f"ignore names unknown layers {missing}; layers are named as in "
            "model.summary()."
        )
    ctx = WalkContext(residual)
    tensors: dict[int, Channels] = {}
    for t in fn.inputs:
        shape = tuple(t.shape)
        if any(d is None for d in shape[1:]):
            raise UnsupportedModelError(
                f"Model {model.name!r} input {t.name!r} has undefined shape "
                f"{shape}: MACs depend on spatial size. Build the model with a "
                "full input shape, e.g. keras.Input((224, 224, 3))."
            )
        seg = ctx.new_segment(shape[-1], f"input:{t.name}", fixed=True)
        tensors[id(t)] = (Part(seg),)
    _walk_functional(fn, "", tensors, ctx, ignore, handlers)
    for t in fn.outputs:
        ctx.fix(tensors[id(t)])
    return ModelGraph(model, ctx, residual, tensors)


def _all_layer_names(fn, prefix):
    """Bare names and ``outer/inner`` paths of every operation."""
    for op in fn.operations:
        yield op.name
        yield prefix + op.name
        if isinstance(op, keras.Model):
            yield from _all_layer_names(_functional_of(op), f"{prefix}{op.name}/")


def _walk_layer(ctx, rec, node, ins, handlers):
    """Run a layer's handler; an ignored layer's channels are then fixed.

    An ignored layer whose handler refuses it (a Reshape that moves channels,
    a grouped conv) is treated as an opaque block instead.
    """
    if not rec.ignored:
        return rec.handler.walk(ctx, rec, node, ins)
    try:
        outs = rec.handler.walk(ctx, rec, node, ins)
    except UnsupportedLayerError:
        rec.terms.clear()
        rec.objective.clear()
        rec.handler = handlers.lookup(None, rec.path, ignored=True)
        outs = rec.handler.walk(ctx, rec, node, ins)
    for ch in list(ins) + list(outs):
        ctx.fix(ch)
    return outs


def _walk_functional(fn, prefix, tensors, ctx, ignore, handlers):
    depths: dict[int, int] = {}
    for node in _topological_nodes(fn):
        op = node.operation
        if isinstance(op, keras.layers.InputLayer):
            continue
        args = node.arguments.keras_tensors
        ins = [tensors[id(t)] for t in args]
        ctx.depth = 1 + max((depths.get(id(t), 0) for t in args), default=0)
        path = prefix + op.name
        if isinstance(op, keras.Model):
            inner = _functional_of(op)
            for t_in, ch in zip(inner.inputs, ins):
                tensors[id(t_in)] = ch
            _walk_functional(inner, path + "/", tensors, ctx, ignore, handlers)
            outs = [tensors[id(t)] for t in inner.outputs]
        else:
            rec = ctx.records.get(id(op))
            if rec is None:
                ignored = op.name in ignore or path in ignore
                handler = handlers.lookup(op, path, ignored=ignored)
                rec = LayerRecord(op, path, handler, ignored)
                ctx.records[id(op)] = rec
                ctx.order.append(rec)
            if rec.calls and getattr(op, "weights", None):  # shared weights
                for first, now in zip(rec.inputs[0], ins):
                    ctx.tie(first, now, path)
            outs = _walk_layer(ctx, rec, node, ins, handlers)
            rec.inputs.append(ins)
            rec.outputs.append(outs)
            rec.calls += 1
        for t, ch in zip(node.outputs, outs):
            tensors[id(t)] = ch
            depths[id(t)] = ctx.depth


def output_shape(node):
    """Static shape of a node's first output."""
    return tuple(node.outputs[0].shape)


def input_shape(node):
    """Static shape of a node's first tensor argument."""
    return tuple(node.arguments.keras_tensors[0].shape)


def as_part(channels: Channels, where) -> Part:
    """The single part of a plain (non-concatenated) descriptor."""
    if len(channels) != 1:
        raise UnsupportedLayerError(
            f"{where}: expected a plain tensor, got a concatenation of "
            f"{len(channels)} blocks."
        )
    return channels[0]


# ---------------------------------------------------------------------------
# Residual structure: from segments to width variables.


@dataclasses.dataclass
class Variable:
    """One width the solver may choose (a channel group or a residual view)."""

    name: str
    width: int
    fixed: bool
    kind: str  # "channels", "stream" or "view"
    bound: int | None = None  # a view/writer is never wider than this variable
    multiple: int = 1  # widths move in multiples of this (grouped convs, GroupNorm)
    layers: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Structure:
    """Width variables and where every segment and reader maps to.

    ``seg_var[root]`` is the variable of a segment's group; ``views[(path,
    root)]`` is the variable a reader layer uses instead of stream ``root``.
    """

    variables: list
    seg_var: dict
    views: dict

    def var_of(self, rec, seg, ctx):
        """Variable of segment ``seg`` as seen by layer ``rec``."""
        root = ctx.find(seg)
        return self.views.get((rec.path, root), self.seg_var[root])


def _resolve(graph: ModelGraph) -> Structure:
    """Decide the width variables of ``graph`` under its residual mode.

    In ``"tie"`` mode every merge ties its inputs and output. In ``"prefix"``
    mode each connected set of merges is a residual stream whose width is set
    by its *creator* (the widest, then shallowest input, e.g. the stem conv or
    a projection shortcut); the other inputs (writers) and each layer reading the stream
    (readers) get their own width, bounded by the stream's. The bounds keep
    the SynExp proxy honest: an unbounded reader would "read" channels that no
    writer produced.
    """
    ctx = graph.ctx
    writers: dict[int, int] = {}  # writer root -> creator root
    if graph.residual == "tie":
        for out, ins, where in ctx.merges:
            for s in ins:
                ctx.union(out, s, where)
    else:
        _resolve_streams(ctx, writers)
    streams = {ctx.find(out) for out, _, _ in ctx.merges}
    variables, seg_var = [], {}
    for s in range(len(ctx.segments)):
        root = ctx.find(s)
        if root not in seg_var:
            seg = ctx.segments[root]
            kind = "stream" if root in streams else "channels"
            seg_var[root] = len(variables)
            variables.append(Variable(seg.name, seg.width, seg.fixed, kind))
    for w, creator in writers.items():
        variables[seg_var[w]].bound = seg_var[ctx.find(creator)]
    for a, b in ctx.leq:
        variables[seg_var[ctx.find(a)]].bound = seg_var[ctx.find(b)]
    views = {}
    if graph.residual == "prefix":
        read = set()  # streams whose first reader reads them whole
        for rec in ctx.order:
            if any(p.mult != 1 or len(ch) != 1 for ch in rec.inputs[0] for p in ch):
                continue
            own = None if rec.out_segment is None else ctx.find(rec.out_segment)
            for root in dict.fromkeys(ctx.find(seg) for seg in rec.readers):
                # A layer whose output is tied into the stream it reads (by an
                # element-wise op, e.g. InceptionResNet's x + scale * conv(x))
                # reads it whole: a view would narrow its output too.
                if root not in streams or root == own:
                    continue
                if root not in read:
                    read.add(root)
                    continue
                views[(rec.path, root)] = len(variables)
                stream = variables[seg_var[root]]
                variables.append(Variable(
                    f"{rec.path}:in", stream.width, False, "view",
                    bound=seg_var[root]))
    structure = Structure(variables, seg_var, views)
    _resolve_multiples(ctx, structure)
    for rec in ctx.order:
        for term in rec.terms:
            for s in (term.a, term.b):
                if s is not None:
                    v = variables[structure.var_of(rec, s, ctx)]
                    if rec.path not in v.layers:
                        v.layers.append(rec.path)
    return structure


def _resolve_multiples(ctx, structure):
    """Give each variable the multiple its readers need.

    A bounded variable (view, writer) passes its multiple on to its bound, so
    clipping it to the bound keeps it a multiple.
    """
    variables = structure.variables
    for rec, seg, m in ctx.multiples:
        v = variables[structure.var_of(rec, seg, ctx)]
        v.multiple = math.lcm(v.multiple, m)
    for _ in range(len(variables)):
        changed = False
        for v in variables:
            if v.bound is not None:
                b = variables[v.bound]
                if b.multiple % v.multiple:
                    b.multiple, changed = math.lcm(b.multiple, v.multiple), True
        if not changed:
            break


def _resolve_streams(ctx, writers):
    """Union each stream's merge outputs with its creator; record writers."""
    parent: dict[int, int] = {}

    def find(s):
        while parent.setdefault(s, s) != s:
            s = parent[s]
        return s

    for out, ins, _ in ctx.merges:
        for s in ins:
            parent[find(ctx.find(s))] = find(ctx.find(out))
    merge_outs = {ctx.find(out) for out, _, _ in ctx.merges}
    members: dict[int, set] = {}
    stream_merges: dict[int, list] = {}
    for out, ins, name in ctx.merges:
        key = find(ctx.find(out))
        stream_merges.setdefault(key, []).append((ins, name))
        members.setdefault(key, set()).update(ctx.find(s) for s in [out, *ins])

    def order(s):  # the creator: the widest, then shallowest input
        return -ctx.segments[s].width, ctx.segments[s].depth, s

    for key, segs in members.items():
        inputs = sorted(segs - merge_outs, key=order)
        creator = inputs[0] if inputs else min(segs)
        for s in sorted(segs - set(inputs[1:])):
            creator = ctx.union(creator, s, stream_merges[key][0][1])
        # A merge's output is as wide as its widest input (PrefixAdd), so one
        # whose inputs are all writers (NASNet's cells add two branches that
        # both also feed other merges of the stream) would come out narrower
        # than the stream it stands for: its widest input is tied to it.
        for ins, name in stream_merges[key]:
            roots = {ctx.find(s) for s in ins}
            if creator not in roots:
                creator = ctx.union(creator, min(roots, key=order), name)
        for w in {ctx.find(w) for w in inputs[1:]} - {creator}:
            writers[w] = creator
