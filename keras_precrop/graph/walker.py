"""Walking a Keras functional graph into channel groups and bilinear costs.

The walker visits every node of a functional model in topological order
(nested Functional and Sequential models are walked in place) and asks the
handler registered for each layer class (``handlers.py``) how channels flow
through it; handlers write segments, ties and cost terms into the data model
of ``channels.py`` (whose docstring defines segment, group, width variable
and view). The result, a :class:`ModelGraph`, holds:

* **groups** of segments whose widths must be equal.
* **cost terms**: ``coef * w_a * w_b`` contributions to parameters and MACs,
  where ``w_a``, ``w_b`` are segment widths (or 1). Every supported layer's
  parameter count and MAC count is a sum of such terms, so one cost model
  serves profiling, solving and predicting the rebuilt model.
* **objective entries**: for each prunable kernel, the segments whose log
  width ratios add up to the log of its density (the SynExp objective).
* **width variables**: element-wise merges (``Add``) are recorded while
  walking and resolved afterwards, either tying everything on a residual
  stream to one width (``residual="tie"``) or giving each layer that reads
  from or writes into the stream its own width bounded by the stream's
  (``residual="prefix"``, the paper's PreCrop rule).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable

import keras

from keras_precrop.errors import (
    ArgumentError,
    ArgumentTypeError,
    UnsupportedLayerError,
    UnsupportedModelError,
)
from keras_precrop.graph import handlers
from keras_precrop.graph import replay as _replay
from keras_precrop.graph import trace as _trace
from keras_precrop.graph.attention import ATTENTION
from keras_precrop.graph.channels import (
    Channels,
    LayerRecord,
    Part,
    WalkContext,
    width_of,
)

# ---------------------------------------------------------------------------
# The walk.


# ``ignore="auto"`` (alone or among the names): every layer the walk refuses, with the remedy of
# keeping it whole, is kept whole too (``budget.costs.resolve_ignore`` resolves it into names).
AUTO = "auto"


def ignore_names(ignore):
    """The layer names ``ignore=`` gives, as a list: one string is one name.

    ``ignore="stem"`` means the layer ``stem``, not the letters of its name;
    :data:`AUTO` stays in the list, for the caller that resolves it.

    Raises:
        ArgumentTypeError: for anything but a string or an iterable of strings
            (``ignore=3``), named as the user passed it.
    """
    names = [ignore] if isinstance(ignore, str) else ignore
    if isinstance(names, Iterable) and not isinstance(names, (bytes, dict)):
        names = list(names)
        if all(isinstance(name, str) for name in names):
            return names
    raise ArgumentTypeError("{ignore:subject} must be a layer name, a list of layer names, or "
                            f"{AUTO!r} (keep whole every layer the walk refuses){{got}}.",
                            ignore=ignore)


def names_of(model, ignore=()):
    """Every name and ``outer/inner`` path ``ignore=`` may give for ``model``'s layers."""
    return set(layer_names(_trace.traced(model, ignore)))


def layer_names(traced, fn=None, prefix=""):
    """Bare names and ``outer/inner`` paths of every operation of a traced model.

    Args:
        traced: the model's :class:`~keras_precrop.graph.trace.Traced` graph
            (which names the layers of dissolved composites by their place,
            ``block1_conv1``, and holds the graphs of nested models).
        fn: the graph to name, ``traced.functional`` or a nested model's.
        prefix: the ``outer/`` path of ``fn``'s operations.
    """
    for op in (traced.functional if fn is None else fn).operations:
        yield traced.name(op)
        yield prefix + traced.name(op)
        if isinstance(op, keras.Model):
            yield from layer_names(traced, traced.graph_of(op), f"{prefix}{traced.name(op)}/")


@dataclasses.dataclass
class LayerCall:
    """One call of a layer, in topological order.

    Tensors are named by *keys*: a nested model's input is the key of the
    outer tensor fed to it and its output the key of the inner tensor it
    returns, so calls inside and outside nested models connect.
    """

    record: LayerRecord
    node: object  # the keras Node of the call
    inputs: list  # tensor keys
    outputs: list  # tensor keys


class ModelGraph:
    """A walked model: its layers' records, channel groups and width variables.

    Attributes:
        model: the walked model.
        residual: the residual mode the width variables were resolved under.
        attention: what attention layers were walked to prune (``"heads"``
            or ``"head_dims"``).
        tensor_channels: ``id(KerasTensor) -> Channels`` for every tensor,
            those of nested models included (a tensor key is such an id).
        calls: every :class:`LayerCall`, in topological order.
        inputs: the keys of the model's input tensors.
        outputs: the keys of the model's output tensors.
        layers: a :class:`~keras_precrop.channels.LayerRecord` per layer, in
            the order of their first call.
        variables: the width variables (:class:`Variable`).
        notes: decisions of the walk a user should know about.
        repairs_checked: ``{id(layer): problem or None}``: the layers a
            rebuild re-created by a repair (``graph/_hub_repairs.py``) and
            what their check found; held here so that the many rebuilds of
            one walk check each repair once.
    """

    def __init__(self, model, walker: _Walker):
        self.model = model
        self.traced = walker.traced
        self.functional = fn = walker.traced.functional
        self.residual = walker.ctx.residual
        self.attention = walker.ctx.attention
        self.tensor_channels = walker.tensors
        self.calls = walker.calls
        self.inputs = [walker.key(t) for t in fn.inputs]
        self.outputs = [walker.key(t) for t in fn.outputs]
        self._ctx = walker.ctx
        self._structure = _resolve(walker.ctx, walker.ctx.residual)
        self.repairs_checked = {}

    @property
    def layers(self) -> list[LayerRecord]:
        return self._ctx.order

    @property
    def variables(self) -> list[Variable]:
        return self._structure.variables

    @property
    def notes(self) -> list[str]:
        return self._ctx.notes

    def record(self, layer) -> LayerRecord:
        """The record of ``layer`` (a layer object of the walked model)."""
        return self._ctx.records[id(layer)]

    def find(self, segment):
        """Representative segment of ``segment``'s group."""
        return self._ctx.find(segment)

    def group_variable(self, segment):
        """Index of the width variable of ``segment``'s group."""
        return self._structure.group_var[self._ctx.find(segment)]

    def scale(self, segment):
        """How many units of its group's variable segment ``segment`` is wide (1 for ``None``).

        A variable counts the greatest common divisor of its group's widths,
        so a segment keeps its ratio to the rest of the group (see
        ``channels.py``): a tensor split into n equal pieces is n pieces wide.
        """
        return 1 if segment is None else _scale(self._ctx, self._structure.units, segment)

    def new_width(self, segment, widths):
        """Width of ``segment`` when the variables have ``widths`` (one per variable)."""
        return int(widths[self.group_variable(segment)]) * self.scale(segment)

    def view(self, rec, segment):
        """Index of layer ``rec``'s view of the stream of ``segment``, or ``None``."""
        return self._structure.views.get((rec.path, self._ctx.find(segment)))

    def variable(self, rec, segment):
        """Index of the width variable through which layer ``rec`` sees ``segment``."""
        view = self.view(rec, segment)
        return self.group_variable(segment) if view is None else view

    def produced_variables(self, rec):
        """Indices of the width variables layer ``rec`` chooses: its output's and its views."""
        out = [] if rec.out_segment is None else [self.group_variable(rec.out_segment)]
        return out + [v for (path, _), v in self._structure.views.items() if path == rec.path]

    def layer_names(self):
        """Every name and ``outer/inner`` path of the model's operations."""
        return set(layer_names(self.traced))

    def width(self, channels):
        """Original number of channels of a descriptor (e.g. ``tensor_channels[key]``)."""
        return width_of(self._ctx, channels)


def _check_ignored_names(model, ignore, names):
    """Refuse the ``ignore=`` names that name no layer, each with the names it may have meant.

    A layer inside a keras_hub backbone or another composite layer is named by
    its place (``vi_t_backbone_vit_encoder_transformer_block_1_ln_1``), not by
    the short name its own ``summary()`` shows (``ln_1``): the names that end
    in the given one, or else the closest spellings, are offered.
    """
    missing = sorted(ignore - names)
    if not missing:
        return
    hints = []
    for name in missing:
        near = sorted(n for n in names if n.endswith(("_" + name, "/" + name))) or \
            difflib.get_close_matches(name, sorted(names), n=3)
        if near and name != AUTO:
            hints.append(f"{name!r} may mean {', '.join(map(repr, near[:4]))}"
                         + (f" (and {len(near) - 4} more)" if len(near) > 4 else ""))
    auto = (f" ({AUTO!r} is resolved by kp.profile, kp.plan, kp.precrop and kp.reconfigure; "
            "pass the names it resolved to, a plan's plan.ignore, here)" if AUTO in missing else "")
    raise ArgumentError(
        f"{{ignore}} names no layer of model {model.name!r}; layers are named as in "
        f"model.summary() or, inside a composite layer, by their place (`keras-precrop profile` "
        f"lists them){auto}{'. ' + '; '.join(hints) if hints else ''}.", ignore=missing)


def walk(model, *, ignore: Iterable[str] = (), residual: str = "prefix", attention: str = "heads"):
    """Walk ``model`` into a :class:`ModelGraph`.

    Args:
        model: a built functional or Sequential ``keras.Model`` with defined
            input shapes (batch dimension excepted).
        ignore: names (or ``outer/inner`` paths for nested models) of layers
            whose channels stay fixed; an ignored layer of an unsupported
            class is treated as an opaque block.
        residual: ``"prefix"`` (each reader/writer of a residual stream gets
            its own width) or ``"tie"`` (the whole stream shares one width).
        attention: ``"heads"`` (an attention layer loses or keeps whole
            heads) or ``"head_dims"`` (it keeps every head and narrows each
            head's dimension, the same in every head; see
            :mod:`keras_precrop.graph.attention`).
    """
    if residual not in ("prefix", "tie"):
        raise ArgumentError("{residual} must be 'prefix' or 'tie'.", residual=residual)
    if attention not in ATTENTION:
        raise ArgumentError(f"{{attention}} must be one of {', '.join(map(repr, ATTENTION))}.",
                            attention=attention)
    ignore = set(ignore_names(ignore))
    refused = []  # every unsupported layer, named at once (see UnsupportedLayerError.together)
    traced = _trace.traced(model, ignore, refused)  # the one trace of this walk; the graph holds it
    fn = traced.functional
    _check_ignored_names(model, ignore, set(layer_names(traced)))
    ignore |= {name for err in refused for name in err.arguments["ignore"]}
    walker = _Walker(WalkContext(residual, attention), ignore, traced, refused)
    for index, t in enumerate(fn.inputs):
        shape = tuple(t.shape)
        if any(d is None for d in shape[1:]):
            raise _undefined_input(model, t)
        seg = walker.ctx.new_segment(shape[-1], _input_variable_name(t, index), fixed=True)
        walker.tensors[id(t)] = (Part(seg),)
    try:
        walker.functional(fn, "")
    except Exception as err:  # past a refusal, a layer walked as if ignored may not walk at all
        if not refused:
            raise
        raise UnsupportedLayerError.together(refused, model.name) from err
    if refused:
        raise UnsupportedLayerError.together(refused, model.name)
    for t in fn.outputs:
        walker.ctx.fix(walker.tensors[id(t)])
    return ModelGraph(model, walker)


def _undefined_input(model, tensor):
    """The refusal of an input with an open size (an image's height and width, a sequence's
    length), its remedy written for that input: its shape with example sizes, its name and dtype."""
    return UnsupportedModelError(
        f"Model {model.name!r} input {tensor.name!r} has undefined shape {tuple(tensor.shape)}: MACs "
        "depend on its sizes (an image's height and width, a sequence's length). Build the model "
        f"on inputs of full shape, e.g. {input_example(tensor.name, tensor.shape, tensor.dtype)}.")


def example_shape(shape):
    """``shape`` (batch first, kept) with its open sizes filled in: 224 for an image's sides, 128
    for a sequence's length (the remedy of a refusal)."""
    size = 224 if len(shape) == 4 else 128
    return tuple(shape)[:1] + tuple(size if d is None else d for d in tuple(shape)[1:])


def input_example(name, shape, dtype="float32"):
    """``keras.Input(...)`` for an input of ``shape`` (batch first), its open sizes filled in
    (:func:`example_shape`)."""
    example = example_shape(shape)[1:]
    return f"keras.Input({example}, name={name!r}{'' if dtype == 'float32' else f', dtype={dtype!r}'})"


def _input_variable_name(tensor, index):
    """The width variable's name of the model input ``tensor``, the ``index``-th.

    The input's own name where the user gave one (``keras.Input(name="image")``:
    ``"input:image"``, as zoo models and older plan files have it), else its
    position (``"input:0"``): Keras names an unnamed input after a global
    counter (``keras_tensor_189``, ``input_layer_9`` once reloaded), which
    differs between two instances of one architecture, and a plan must fit both.
    """
    if _AUTO_INPUT_NAME.fullmatch(tensor.name):
        return f"input:{index}"
    return f"input:{tensor.name}"


_AUTO_INPUT_NAME = re.compile(r"(keras_tensor|input_layer)(_\d+)?")


class _Walker:
    """The state of one walk: the context, tensors' channels and the calls."""

    def __init__(self, ctx: WalkContext, ignore, traced, refused):
        self.ctx = ctx
        self.refused = refused  # layers refused so far, each then walked as if ignored
        self.ignore = ignore
        self.traced = traced
        self.tensors: dict[int, Channels] = {}
        self.calls: list[LayerCall] = []
        self._alias: dict[int, int] = {}  # a nested model's tensor -> its key

    def key(self, t):
        """The key of tensor ``t`` (see :class:`LayerCall`)."""
        return self._alias.get(id(t), id(t))

    def functional(self, fn, prefix):
        """Walk the nodes of functional ``fn``, nested models in place; its outputs' channels."""
        depths: dict[int, int] = {}  # a tensor's depth in ``fn``: 1 + its deepest input's

        def call(node, ins):
            args = node.arguments.keras_tensors
            self.ctx.depth = 1 + max((depths.get(id(t), 0) for t in args), default=0)
            outs = self._node(node, prefix + self.traced.name(node.operation), ins)
            for t in node.outputs:
                depths[id(t)] = self.ctx.depth
            return outs

        return _replay.replay(fn, self.tensors, call)

    def _node(self, node, path, ins):
        """Walk one call ``node`` whose inputs have channels ``ins``; its outputs' channels."""
        op, args = node.operation, node.arguments.keras_tensors
        if isinstance(op, keras.Model):
            inner = self.traced.graph_of(op)
            for t_in, t, ch in zip(inner.inputs, args, ins):
                self.tensors[id(t_in)] = ch
                self._alias[id(t_in)] = self.key(t)
            outs = self.functional(inner, path + "/")
            for t, t_inner in zip(node.outputs, inner.outputs):
                self._alias[id(t)] = self.key(t_inner)
            return outs
        outs = self._layer(op, path, node, ins)
        self.calls.append(LayerCall(self.ctx.records[id(op)], node, [self.key(t) for t in args],
                                    [self.key(t) for t in node.outputs]))
        return outs

    def _layer(self, op, path, node, ins):
        """Walk one call of layer ``op``; returns its outputs' channels."""
        ctx = self.ctx
        rec = ctx.records.get(id(op))
        if rec is None:
            _refuse_quantized(op, path)
            ignored = self.traced.name(op) in self.ignore or path in self.ignore
            try:
                handler = _unless_lora(op, path, ignored, handlers.lookup(op, path, ignored=ignored))
            except UnsupportedLayerError as err:
                self.refused.append(err)
                ignored, handler = True, handlers.OPAQUE
            rec = LayerRecord(op, path, handler, ignored)
            ctx.records[id(op)] = rec
            ctx.order.append(rec)
        if rec.calls and getattr(op, "weights", None) and rec.handler.ties_shared_inputs:  # shared weights
            for first, now in zip(rec.inputs[0], ins):
                ctx.tie(first, now, path)
        outs = _walk_layer(ctx, rec, node, ins, self.refused)
        rec.inputs.append(ins)
        rec.outputs.append(outs)
        rec.calls += 1
        return outs


def _refuse_quantized(op, path):
    """Refuse a quantized layer (``model.quantize(...)``): its weights are not float kernels."""
    mode = getattr(getattr(op, "dtype_policy", None), "quantization_mode", None)
    if mode:
        raise UnsupportedLayerError(
            f"Layer {path!r} is quantized ({mode}): quantized layers are not supported. "
            "Prune before quantizing: precrop the float model, train it, then call "
            "model.quantize(...) on the result.")


def _unless_lora(op, path, ignored, handler):
    """``handler``, unless layer ``op`` has LoRA enabled (``enable_lora``): its low-rank kernels
    are weights no channel rule reads, so it is refused by name, or kept whole as an opaque block
    (every weight counted) where ignored."""
    if not getattr(op, "lora_enabled", False):
        return handler
    if ignored:
        return handlers.OPAQUE
    raise UnsupportedLayerError(
        f"Layer {path!r} ({type(op).__name__}) has LoRA enabled: its low-rank kernels are "
        "weights no channel rule prunes; prune before enabling LoRA (precrop the model, then "
        "call enable_lora on the result's layers). Or keep it whole with {ignore}.", ignore=[path])


def _walk_layer(ctx, rec, node, ins, refused):
    """Run a layer's handler; an ignored layer's channels are then fixed.

    Fixed are its inputs, its outputs and the units it creates inside (an
    attention layer's heads or head dimensions), so that it stays whole.

    An ignored layer whose handler refuses it (a Reshape that moves channels,
    a grouped conv) is treated as an opaque block instead. A refusal that
    ``ignore`` remedies joins ``refused`` and the layer is walked as ignored,
    so the walk goes on to find the others.
    """
    if not rec.ignored:
        try:
            return rec.handler.walk(ctx, rec, node, ins)
        except UnsupportedLayerError as err:
            if not err.arguments.get("ignore"):
                raise
            refused.append(err)
            rec.ignored = True
    try:
        outs = rec.handler.walk(ctx, rec, node, ins)
    except UnsupportedLayerError:
        rec.terms.clear()
        rec.objective.clear()
        rec.kernels = 0
        rec.handler = handlers.OPAQUE
        outs = rec.handler.walk(ctx, rec, node, ins)
    inner = [(Part(rec.out_segment),)] if rec.out_segment is not None else []  # attention's heads
    for ch in list(ins) + list(outs) + inner:
        ctx.fix(ch)
    return outs


# ---------------------------------------------------------------------------
# Residual structure: from segments to width variables.


@dataclasses.dataclass
class Variable:
    """A width variable: a group or a view (see ``channels.py``) the solver sizes.

    Attributes:
        name: the group's name (its oldest segment's), ``"<reader>:in"`` for a view.
        width: the original width.
        fixed: the width may not change (model inputs and outputs, ignored layers,
            a concatenated part that a grouped conv reads and that is no multiple
            of its groups).
        kind: ``"channels"``, ``"stream"``, ``"view"`` or ``"heads"`` (attention heads,
            whole units: ``round_to`` and ``min_channels`` do not apply).
        bound: index of the variable this one may never be wider than.
        multiple: the width stays a multiple of this (grouped convolutions,
            group normalization keep their group count).
        layers: paths of the layers whose costs depend on it.
        least: the narrowest width of a ``"heads"`` variable (1: one head); a
            tie's class of heads and the channels they set (a ViT's hidden
            width, in units of one head) says more, where ``min_channels``
            asks it of those channels.
    """

    name: str
    width: int
    fixed: bool
    kind: str  # "channels", "stream", "view" or "heads"
    bound: int | None = None  # a view/writer is never wider than this variable
    multiple: int = 1  # widths move in multiples of this (grouped convs, GroupNorm)
    layers: list = dataclasses.field(default_factory=list)
    least: int = 1  # the narrowest width of "heads" (a tie's class of heads and channels: more)


@dataclasses.dataclass
class _Structure:
    """Width variables and where every segment and reader maps to.

    ``group_var[root]`` is the variable of the group represented by segment
    ``root`` and ``units[root]`` the width it counts in; ``views[(path,
    root)]`` is the variable a reader layer uses instead of stream ``root``.
    """

    variables: list
    group_var: dict
    views: dict
    units: dict


def _resolve(ctx: WalkContext, residual) -> _Structure:
    """Decide the width variables of a walk under residual mode ``residual``.

    In ``"tie"`` mode every merge ties its inputs and output. In ``"prefix"``
    mode each connected set of merges is a residual stream whose width is set
    by its *creator* (the widest, then shallowest input, e.g. the stem conv or
    a projection shortcut); the other inputs (writers) and each layer reading the stream
    (readers) get their own width, bounded by the stream's. The bounds keep
    the SynExp proxy honest: an unbounded reader would "read" channels that no
    writer produced.
    """
    writers: dict[int, int] = {}  # writer root -> creator root
    if residual == "tie":
        for out, ins, where in ctx.merges:
            for s in ins:
                ctx.union(out, s, where)
    else:
        _resolve_streams(ctx, writers)
    units = _units(ctx)
    _check_bounds(ctx, units)
    streams = {ctx.find(out) for out, _, _ in ctx.merges}
    variables, group_var = [], {}
    for s in range(len(ctx.segments)):
        root = ctx.find(s)
        if root not in group_var:
            seg = ctx.segments[root]
            kind = "stream" if root in streams else seg.kind
            group_var[root] = len(variables)
            name = seg.name if seg.width == units[root] else f"{seg.name}:1/{seg.width // units[root]}"
            variables.append(Variable(name, units[root], seg.fixed, kind))
    for w, creator in writers.items():
        variables[group_var[w]].bound = group_var[ctx.find(creator)]
    for a, b in ctx.leq:
        variables[group_var[ctx.find(a)]].bound = group_var[ctx.find(b)]
    views = {}
    if residual == "prefix":
        read = set()  # streams whose first reader reads them whole
        for rec in ctx.order:
            if any(p.mult != 1 or len(ch) != 1 for ch in rec.inputs[0] for p in ch):
                continue
            own = None if rec.out_segment is None else ctx.find(rec.out_segment)
            for root in dict.fromkeys(ctx.find(seg) for seg in rec.read_segments):
                # A layer whose output is tied into the stream it reads (by an
                # element-wise op, e.g. InceptionResNet's x + scale * conv(x))
                # reads it whole: a view would narrow its output too.
                if root not in streams or root == own:
                    continue
                if root not in read:
                    read.add(root)
                    continue
                views[(rec.path, root)] = len(variables)
                stream = variables[group_var[root]]
                variables.append(Variable(  # an ignored reader reads its stream whole
                    f"{rec.path}:in", stream.width, rec.ignored, "view",
                    bound=group_var[root]))
    _resolve_multiples(ctx, variables, group_var, views, units)
    for rec in ctx.order:
        for term in rec.terms:
            for s in (term.a, term.b):
                if s is not None:
                    root = ctx.find(s)
                    v = variables[views.get((rec.path, root), group_var[root])]
                    if rec.path not in v.layers:
                        v.layers.append(rec.path)
    return _Structure(variables, group_var, views, units)


def _units(ctx):
    """``{root: the greatest common divisor of its group's widths}``: what its variable counts."""
    units = {}
    for s, seg in enumerate(ctx.segments):
        root = ctx.find(s)
        units[root] = math.gcd(units.get(root, 0), seg.width)
    return units


def _scale(ctx, units, segment):
    """How many of its group's units (``_units``) ``segment`` is wide."""
    return ctx.segments[segment].width // units[ctx.find(segment)]


def _check_bounds(ctx, units):
    """Refuse a bound between segments of different scales (see ``ModelGraph.scale``).

    A bound (a residual writer or view never wider than its stream, a slice
    never wider than its source) compares two variables in their own units,
    which holds only when both segments are as many units wide: a residual
    add onto a piece of an unequal split, which its group counts in smaller
    units, breaks it.
    """
    pairs = [(s, out, where) for out, ins, where in ctx.merges for s in ins]
    pairs += [(a, b, ctx.segments[a].name) for a, b in ctx.leq]
    for a, b, where in pairs:
        free = not (ctx.segments[ctx.find(a)].fixed and ctx.segments[ctx.find(b)].fixed)
        if free and _scale(ctx, units, a) != _scale(ctx, units, b):
            split = ctx.segments[ctx.find(a if _scale(ctx, units, a) != 1 else b)].name
            raise UnsupportedLayerError(
                f"{where}: bounds {ctx.segments[a].name} by {ctx.segments[b].name}, but a "
                f"split (keras.ops.split) of {split} into unequal pieces counts them in "
                "different units of channels. Pass {ignore} to keep them fixed.",
                ignore=[where.split("/")[-1]])


def _resolve_multiples(ctx, variables, group_var, views, units):
    """Give each variable the multiple its readers need.

    A segment ``k`` units wide needs its variable to be a multiple of
    ``m / gcd(m, k)``. A bounded variable (view, writer) passes its multiple
    on to its bound, so clipping it to the bound keeps it a multiple.

    A grouped conv only needs the *sum* of a concatenation's parts to be a
    multiple of its groups, so a part may be no multiple itself (12 + 13 + 8
    channels into ``groups=3``). Such a part's variable is fixed: every
    other part moves in multiples of the groups from a multiple, so the sum
    stays one (a part left to move would break it: 9 + 3 + 8 is no multiple of 3).
    """
    for rec, seg, m in ctx.multiples:
        root = ctx.find(seg)
        v = variables[views.get((rec.path, root), group_var[root])]
        v.multiple = math.lcm(v.multiple, m // math.gcd(m, _scale(ctx, units, seg)))
    for _ in range(len(variables)):
        changed = False
        for v in variables:
            if v.bound is not None:
                b = variables[v.bound]
                if b.multiple % v.multiple:
                    b.multiple, changed = math.lcm(b.multiple, v.multiple), True
        if not changed:
            break
    for v in variables:
        if v.width % v.multiple:
            v.fixed = True


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
    members: dict[int, dict] = {}  # stream -> {group root: a segment of its merges}
    stream_merges: dict[int, list] = {}
    for out, ins, name in ctx.merges:
        key = find(ctx.find(out))
        stream_merges.setdefault(key, []).append((ins, name))
        for s in [out, *ins]:
            members.setdefault(key, {}).setdefault(ctx.find(s), s)

    def order(s):  # the creator: the widest, then shallowest input
        root = ctx.find(s)
        return -ctx.segments[s].width, ctx.segments[root].depth, root

    for key, group in members.items():
        # Segments as the merges see them: a split's piece is narrower than its group's root.
        inputs = sorted((s for r, s in group.items() if r not in merge_outs), key=order)
        creator = inputs[0] if inputs else group[min(group)]
        for s in sorted(set(group.values()) - set(inputs[1:])):
            ctx.union(creator, s, stream_merges[key][0][1])
        # A merge's output is as wide as its widest input (PrefixAdd), so one
        # whose inputs are all writers (NASNet's cells add two branches that
        # both also feed other merges of the stream) would come out narrower
        # than the stream it stands for: its widest input is tied to it.
        for ins, name in stream_merges[key]:
            if ctx.find(creator) not in {ctx.find(s) for s in ins}:
                ctx.union(creator, min(ins, key=order), name)
        for w in {ctx.find(w) for w in inputs[1:]} - {ctx.find(creator)}:
            writers[w] = ctx.find(creator)
