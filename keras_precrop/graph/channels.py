"""The channel data model that layer handlers write into while a model is walked.

The package's vocabulary, stated once (segment -> group -> width variable / view):

* **segment**: one channel axis as the walk creates it (a model input, the
  output of a layer that makes new channels, a residual merge, an opaque
  block), with its original width. Segments are numbered in creation order.
* **group**: segments that must keep one width (tied through batch norm,
  activations, depthwise convs, element-wise ops, shared layers, ...), kept
  in a union-find; its oldest segment represents and names it. The pieces
  of a split (``keras.ops.split``) join the group of the tensor split while
  keeping their widths' ratio to it: every segment of a group keeps its
  original width's ratio to the others.
* **width variable**: a width the solver chooses (``graph.Variable``). Each
  group is one variable, counted in the greatest common divisor of its
  segments' widths (a segment's width when they all agree; one piece when a
  tensor is split into equal pieces), each segment being a fixed multiple,
  its *scale*, of it: kind ``"channels"``, or ``"stream"`` for a residual
  stream (a group joined by ``Add`` merges). Under ``residual="tie"`` all
  of a stream's writers are in its group. Under ``residual="prefix"`` (the
  paper's PreCrop rule) the writer that creates the stream (a stem conv, a
  projection shortcut) sets its width, every other writer keeps its own
  group, bounded by the stream's width, and each layer that reads the stream
  gets a **view**: a variable of kind ``"view"`` of its own, bounded likewise.

Profiles, plans and their JSON name variables (``ModelProfile.variables``,
``Plan.variables``); a layer's ``in_variables``/``out_variables`` are the
variables it reads and writes.

A tensor's channel axis is described by :data:`Channels`, an ordered tuple of
:class:`Part` s (a concatenation has several); layer costs are bilinear
:class:`Term` s in segment widths, kept per layer in a :class:`LayerRecord`.
"""

from __future__ import annotations

import dataclasses
import math

import keras

from keras_precrop.errors import UnsupportedLayerError


@dataclasses.dataclass(frozen=True)
class Part:
    """A contiguous block of ``mult * width(segment)`` channels of a tensor.

    ``mult`` > 1 when a depthwise multiplier or a flatten repeats the
    segment's channels.
    """

    segment: int
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
    kernels: int = 0  # prunable kernels declared (add_kernel), which the objective entries sum
    out_segment: int | None = None  # the segment the layer creates (new_output)
    out_kind: str = "channels"  # what out_segment counts (see _Segment.kind)
    read_segments: list = dataclasses.field(default_factory=list)  # inputs of its kernels
    macs_unknown: bool = False  # an opaque layer whose MACs the backend cannot count

    @property
    def class_name(self):
        return type(self.layer).__name__


@dataclasses.dataclass
class _Segment:
    width: int
    name: str
    depth: int
    fixed: bool = False
    # What its width counts: "channels"; "heads" (attention heads, whole units); "head_dims" (the
    # dimension of every head of an attention layer, rounded as channels are).
    kind: str = "channels"


class WalkContext:
    """The state handlers read and write while the graph is walked.

    Handlers declare through its methods only (``new_output``,
    ``add_kernel``, ``add_term``, ``tie``, ``split``, ``fix``,
    ``multiple_of``, ``merge``, ``at_most``, ``note``) and read
    ``segments``/``find``; the attributes behind them belong to the walker.
    """

    def __init__(self, residual, attention="heads"):
        self.residual = residual
        self.attention = attention  # what attention layers prune: "heads" or "head_dims"
        self.segments: list[_Segment] = []
        self._parent: list[int] = []
        self.merges: list[tuple[int, list[int], str]] = []  # (out, ins, where)
        self.leq: list[tuple[int, int]] = []  # width(a) <= width(b)
        self.multiples: list[tuple[LayerRecord, int, int]] = []  # (reader, segment, m)
        self.records: dict[int, LayerRecord] = {}
        self.order: list[LayerRecord] = []
        self.depth = 0  # depth of the node being walked
        self.notes: list[str] = []  # decisions a user should know about
        # id(KerasTensor) -> its shape for one example, where the graph leaves a size open that a
        # layer kept whole gave when measured (a reshape to -1 of a known size: Swin's merging)
        self.concrete: dict[int, tuple] = {}

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

    def union(self, a, b, where, ratio=False):
        """Tie two segments to one width; ``where`` names the layer for errors.

        With ``ratio`` the segments may differ in width and keep their ratio
        instead (a split's pieces and the tensor it splits).
        """
        sa, sb = self.segments[a], self.segments[b]
        if not ratio and sa.width != sb.width:
            raise UnsupportedLayerError(
                f"{where}: cannot couple channel axes of different widths "
                f"({sa.name}: {sa.width} vs {sb.name}: {sb.width})."
            )
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        sa, sb = self.segments[ra], self.segments[rb]
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
                    f"{width_of(self, b)} channels. Pass {{ignore}} to keep them fixed.",
                    ignore=[where.split('/')[-1]])
            self.fix(a)
            self.fix(b)
            self.note(
                f"{where}: couples a concatenation (or depthwise-multiplied "
                "tensor) with a differently built tensor; those channels are "
                "kept fixed.")
            return
        for p, q in zip(a, b):
            self.union(p.segment, q.segment, where)

    def split(self, rec, channels: Channels, sizes) -> list:
        """``channels`` cut into consecutive pieces of ``sizes`` channels, as ``rec`` splits them.

        Each piece is a new segment in the group of the tensor split, keeping
        its width's ratio to it, so a split keeps its proportions: into
        ``n`` equal pieces, the input moves in multiples of ``n`` and each
        piece is one ``n``-th of it. Returns one descriptor per piece.
        """
        src = as_part(channels, rec.path)
        pieces = []
        for i, size in enumerate(sizes):
            seg = self.new_segment(size, f"{rec.path}:{i}")
            self.union(src.segment, seg, rec.path, ratio=True)
            pieces.append((Part(seg),))
        return pieces

    def multiple_of(self, rec, channels: Channels, m):
        """Require each part of ``channels``, as ``rec`` sees it, to stay a multiple of ``m``.

        Grouped convolutions and group normalization keep their group count,
        so their channel counts move in multiples of it.
        """
        for p in channels:
            need = m // math.gcd(m, p.mult)
            if need > 1:
                self.multiples.append((rec, p.segment, need))

    def fix(self, channels: Channels):
        """Mark every group of a descriptor as not prunable."""
        for p in channels:
            self.segments[self.find(p.segment)].fixed = True

    # -- what handlers declare ---------------------------------------------
    def merge(self, rec, out_segment, in_segments):
        """Declare a residual merge (an ``Add``): ``in_segments`` join into ``out_segment``.

        The walk resolves merges into streams once every layer is seen
        (``residual="prefix"``: views and prefixes; ``"tie"``: one group).
        """
        self.merges.append((out_segment, list(in_segments), rec.path))

    def at_most(self, a, b):
        """Declare that segment ``a`` is never wider than segment ``b`` (a slice of it)."""
        self.leq.append((a, b))

    def note(self, text):
        """Record a decision the user should know about (shown under the profile)."""
        self.notes.append(text)

    def new_output(self, rec, width, kind="channels") -> Channels:
        """The channels layer ``rec`` creates: ``width`` new channels named after it.

        The segment is created on the layer's first call and reused on later
        calls (a shared layer has one set of weights); it is
        ``rec.out_segment``, the segment ``Handler.configure`` rewrites.
        ``kind="heads"`` counts attention heads (``attention.py``): whole
        units that ``round_to`` and ``min_channels`` do not apply to;
        ``kind="head_dims"`` the per-head dimension of an attention layer.
        """
        if rec.out_segment is None:
            rec.out_segment = self.new_segment(width, rec.path)
            self.segments[rec.out_segment].kind = rec.out_kind = kind
        return (Part(rec.out_segment),)

    def add_term(self, rec, params, macs, a=None, b=None):
        """Add ``coef * width(a) * width(b)``; ``a``/``b`` are Parts or None.

        Parameters belong to the layer and MACs to each call: on a later call
        of a shared layer the term keeps its MACs only.
        """
        if rec.calls:
            if not macs:
                return
            params = 0
        coef = 1
        segs = []
        for p in (a, b):
            if p is not None:
                coef *= p.mult
                segs.append(p.segment)
        segs += [None] * (2 - len(segs))
        rec.terms.append(Term(params * coef, macs * coef, segs[0], segs[1]))

    def add_kernel(self, rec, ins: Channels, out: Channels | None = None, *,
                   params, macs, bias=False, view=True):
        """Declare a prunable kernel: its cost terms and its SynExp objective entry.

        With ``out`` the kernel joins every channel of ``ins`` to every channel
        of ``out`` (a convolution or dense kernel): ``params`` weights and
        ``macs`` multiply-accumulates per channel pair, and the layer reads
        ``ins`` (a layer reading a residual stream may get a view of it).
        Without ``out`` the kernel is depthwise: ``params`` weights and
        ``macs`` MACs per channel of ``ins``, which are also its output
        channels (pass them multiplied by the depth multiplier).

        Args:
            rec: the layer's record.
            ins: the channels the kernel reads.
            out: the channels it writes, or ``None`` for a depthwise kernel.
            params: weights per channel pair (depthwise: per channel).
            macs: multiply-accumulates per channel pair and call.
            bias: the layer adds one bias per output channel.
            view: under ``residual="prefix"`` a layer reading a residual stream
                may read a narrower view of it; ``False`` reads it whole (an
                attention layer, whose output keeps its query's channels and
                whose other inputs no slice reaches).
        """
        outs = ins if out is None else out
        for p in ins:
            for q in ((None,) if out is None else out):
                self.add_term(rec, params, macs, p, q)
        if bias:
            for q in outs:
                self.add_term(rec, 1, 0, q)
        if rec.calls == 0:
            rec.kernels += 1
            self._add_objective(rec, ins, *(() if out is None else (out,)))
            if out is not None and view:
                rec.read_segments.extend(p.segment for p in ins)

    def _add_objective(self, rec, *factors: Channels):
        """Declare a prunable kernel whose density is the product of factors.

        A factor with several parts (a concatenation) contributes the
        width-weighted mean of its parts' log ratios, a concave lower bound
        of its true log ratio that keeps the program convex.
        """
        for channels in factors:
            total = sum(p.mult * self.segments[p.segment].width for p in channels)
            for p in channels:
                weight = p.mult * self.segments[p.segment].width / total
                rec.objective.append((weight, p.segment))


def channels_width(channels: Channels, width):
    """Number of channels ``channels`` describe when segment ``s`` has ``width(s)`` channels.

    The one place a descriptor's parts are summed: at the original widths
    (:func:`width_of`), at a plan's new widths (``Handler.configure``'s
    ``width``), in a rebuild and in its check.
    """
    return sum(int(width(p.segment)) * p.mult for p in channels)


def width_of(ctx, channels: Channels):
    """Original number of channels described by ``channels``."""
    return channels_width(channels, lambda s: ctx.segments[s].width)


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
