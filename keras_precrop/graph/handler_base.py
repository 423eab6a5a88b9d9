"""The handler base: how a layer's weights are laid out and the contract of a handler.

:class:`Handler` is what every rule of the handler table (``handlers.py``) and
a user's own rule (``kp.register_handler``) implement; :class:`WeightSpec`
describes a maskable weight. They live apart from the table so that rule
modules (``shape_handlers.py``, future attention rules) can subclass them
without importing the table that registers them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from keras_precrop.graph.channels import output_shape


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """How a maskable weight of a layer class is laid out and persisted.

    Attributes:
        constraint_attr: the layer attribute that ``get_config`` serializes as
            this weight's constraint (``kernel_constraint``, ...); the mask
            constraint is stored there so it survives ``.keras`` save/load.
        kind: ``"kernel"`` (mixes input into output channels), ``"depthwise"``
            (one ``k x k x multiplier`` slab per input channel), ``"bias"`` or
            ``"scale"`` (per-output-channel vectors: biases, BN gamma/beta).
        in_axis: kernel axis indexing input channels (``None`` for vectors).
        out_axis: kernel axis indexing output channels, or the depthwise
            multiplier axis (``None`` for vectors).
        groups: a grouped convolution's group count: its kernel's input axis
            holds the ``c_in / groups`` channels of each group, and output
            channel ``o`` belongs to group ``o // (c_out / groups)``.
    """

    constraint_attr: str
    kind: str
    in_axis: int | None = None
    out_axis: int | None = None
    groups: int = 1

    def block_diagonal(self, local):
        """A grouped kernel's ``(c_in / groups, c_out)`` channel matrix over all ``c_in`` inputs.

        The matrix is the last two axes; leading (spatial) axes are kept.
        Entry ``[j * a + i, o]`` (``a = c_in / groups``) is ``local[i, o]`` when
        output ``o`` belongs to group ``j``, else ``False``: a group's outputs
        see only its own inputs. The identity for an ungrouped kernel.
        """
        if self.groups == 1:
            return local
        a, n_out = local.shape[-2:]
        b = n_out // self.groups
        full = np.zeros(local.shape[:-2] + (a * self.groups, n_out), local.dtype)
        for j in range(self.groups):
            full[..., j * a:(j + 1) * a, j * b:(j + 1) * b] = local[..., :, j * b:(j + 1) * b]
        return full

    def group_local(self, full):
        """The inverse of :meth:`block_diagonal`: each output's own group's rows."""
        if self.groups == 1:
            return full
        n_in, n_out = full.shape[-2:]
        a, b = n_in // self.groups, n_out // self.groups
        rows = (np.arange(n_out) // b)[None, :] * a + np.arange(a)[:, None]
        return full[..., rows, np.arange(n_out)[None, :]]


BIAS = {"bias": WeightSpec("bias_constraint", "bias")}


class Handler:
    """How channels flow through a layer class: the base of every handler.

    Register an instance for a layer class with :func:`register_handler`;
    subclasses of that class inherit it. The contract:

    * ``walk(ctx, rec, node, ins)`` runs once per call of the layer, in
        topological order. ``ins`` holds a :data:`~keras_precrop.channels.Channels`
        descriptor per input tensor of ``node`` (``rec.calls`` is the number of
        earlier calls; a shared layer's inputs are already tied to its first
        call's). It returns one descriptor per output tensor and declares, on
        the context ``ctx`` (a :class:`~keras_precrop.channels.WalkContext`),
        how the layer couples channels and what it costs:

        - ``ctx.new_output(rec, width)``: channels the layer creates (filters,
          units); they become ``rec.out_segment``.
        - ``ctx.add_kernel(rec, ins[0], out, params=..., macs=..., bias=...)``:
          a prunable kernel with its parameters and MACs (per channel pair) and
          its SynExp objective entry; ``out=None`` for a depthwise kernel.
        - ``ctx.add_term(rec, params, macs, a, b)``: any other cost bilinear in
          widths, ``ctx.tie(a, b, rec.path)``: channels that must stay equal,
          ``ctx.fix(channels)``: channels that must not change,
          ``ctx.split(rec, channels, sizes)``: pieces of a tensor's channels,
          ``ctx.multiple_of(rec, channels, m)``: channels that move in
          multiples of ``m`` (groups), ``ctx.merge(rec, out, ins)``: a residual
          merge, ``ctx.at_most(a, b)``: a segment never wider than another,
          ``ctx.note(text)``: a decision the user should know about.

        Shapes come from ``keras_precrop.graph.output_shape(node)`` and
        ``input_shape(node)``; a descriptor's channel count from
        ``width_of(ctx, channels)`` (original) or, in ``configure``,
        ``keras_precrop.graph.channels_width(channels, width)`` (new).

        The context keeps the rules of shared layers: parameters and objective
        entries count on the first call only, MACs on every call. Raise
        :class:`~keras_precrop.UnsupportedLayerError` for a
        configuration the rule cannot describe.

    * ``configure(rec, config, width)`` returns the layer's config for new
      widths when the model is rebuilt; ``width(segment)`` is the new width of
      a segment (e.g. ``rec.out_segment``). A stateless ``keras.ops``
      operation has no config to rewrite and replays as recorded;
      ``rebuild_op(rec, op, width)`` returns a new one when its arguments
      name channels.
    * ``weight_specs`` names the maskable weights for the pruning baselines
      (``keras_precrop.pai``; ``specs_of(layer)`` when they depend on the
      layer's config) and ``channel_map(rec, node)`` says which input
      channel each output channel comes from.
    * ``channel_axes(rec, node)`` says which axes of each weight index
      channels, so a rebuild can carry trained weights over
      (``weights="keep"``); the default reads ``specs_of``.

    Example: a 1x1 convolution written from ``keras.ops``, taught to the
    package in one place, then profiled, pruned and masked.

    >>> import math
    >>> import keras
    >>> import keras_precrop as kp
    >>> from keras_precrop.graph.channels import output_shape
    >>> class Pointwise(keras.layers.Layer):
    ...     def __init__(self, filters, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.filters = filters
    ...     def build(self, input_shape):
    ...         self.kernel = self.add_weight(shape=(input_shape[-1], self.filters), name="kernel")
    ...     def call(self, x):
    ...         return keras.ops.matmul(x, self.kernel)
    ...     def get_config(self):
    ...         return {**super().get_config(), "filters": self.filters}
    >>> class PointwiseHandler(kp.Handler):
    ...     def walk(self, ctx, rec, node, ins):
    ...         out = ctx.new_output(rec, rec.layer.filters)
    ...         pixels = math.prod(output_shape(node)[1:-1])
    ...         ctx.add_kernel(rec, ins[0], out, params=1, macs=pixels)
    ...         return [out]
    ...     def configure(self, rec, config, width):
    ...         return {**config, "filters": width(rec.out_segment)}
    ...     weight_specs = {"kernel": kp.WeightSpec("kernel_constraint", "kernel", in_axis=0, out_axis=1)}
    >>> kp.register_handler(Pointwise, PointwiseHandler())
    >>> x = keras.Input((8, 8, 3))
    >>> h = Pointwise(16, name="expand")(x)
    >>> pooled = keras.layers.GlobalAveragePooling2D()(h)
    >>> model = keras.Model(x, keras.layers.Dense(10, name="head")(pooled))
    >>> kp.profile(model).total_params == model.count_params() == 3 * 16 + 16 * 10 + 10
    True
    >>> small = kp.precrop(model, params=0.5)  # 3 w + 10 w + 10 <= 109 parameters
    >>> small.get_layer("expand").filters, small.count_params()
    (7, 101)
    >>> sorted(kp.pai.magnitude(model, 0.5))
    ['expand/kernel', 'head/kernel']
    """

    weight_specs: dict = {}
    """``{variable name: WeightSpec}`` of the layer's maskable weights, kernels in
    the order the layer applies them (a separable conv's depthwise kernel
    before its pointwise one); none by default."""

    ties_shared_inputs: bool = True
    """Whether the walk ties the inputs of every call of a layer with weights to its first
    call's (one set of weights reads one set of channels). ``False`` for a rule that relates
    its calls itself (a ``ReversibleEmbedding`` reads ids, then the stream it created) or
    whose inputs it fixes (an opaque block)."""

    def walk(self, ctx, rec, node, ins):
        """Return output descriptors (one per output tensor); declare costs on ``ctx``."""
        raise NotImplementedError

    def specs_of(self, layer):
        """``weight_specs`` of one layer of the class (a copy; override if config-dependent)."""
        return dict(self.weight_specs)

    def configure(self, rec, config, width):
        """Return ``config`` updated for new widths (``width(segment)``)."""
        return config

    def rebuild_op(self, rec, op, width):
        """The operation a rebuild replays for the stateless ``keras.ops`` op ``op``.

        ``op`` itself by default (its arguments do not depend on widths);
        override to return a new op for the new widths (``width(segment)``).
        """
        return op

    def mixes_statistics(self, rec, node):
        """Whether the layer computes statistics across its channels (a LayerNormalization).

        Cutting such a layer's channels changes what it computes for the
        channels that stay; a plan's summary says where it does (``node``:
        the layer's first call). ``False`` by default (BatchNormalization's
        statistics are per channel).
        """
        return False

    def masked_call(self, rec):
        """``rec.layer``'s computation with its statistics over the channels a 0/1 ``keep`` (per
        channel of the last axis) keeps, as ``call(inputs, keep)``, for a layer that normalizes
        over its channels: ``GradualPruning`` lends it during ``fit`` so the masked model computes
        what the rebuilt one does. ``None`` (the default): cannot, and a cut is refused by name.
        """
        return None

    def carried_value(self, rec, new_layer, weight, value):
        """The value ``weights="keep"`` gives ``new_layer``'s counterpart of ``weight``, from
        ``value``, ``weight``'s kept slices (see :meth:`channel_axes`): as is by default. A layer
        whose computation depends on a width it is configured with (attention's ``1/sqrt(key_dim)``)
        rescales here so the rebuilt layer computes what the original does on what it keeps.
        """
        return value

    def channel_map(self, rec, node):
        """Which input channel each output channel of a call comes from.

        Returns a list with an int array per input tensor of ``node``, of the
        output's channel count (of all outputs' together, in order, when
        they are pieces of the channel axis, e.g. a split's), naming the
        input channel each output channel reads (``-1``: none of this
        input's), or ``None`` when every output channel may depend on every
        input channel (the default, right for kernels and opaque blocks). The
        pruning baselines follow channels through layers with it.
        """
        return None

    def channel_axes(self, rec, node):
        """Which axes of each of the layer's weights index channels, and which channels.

        Keeping trained weights (``weights="keep"``) slices every weight along
        these axes to the channels that survive (and, for layers that grow,
        starts new channels from the initializer). Returns one dict per
        weight of ``rec.layer.weights``, in order, mapping an axis to a role
        (``node`` is the layer's first call; a weight with no entry is copied whole):

        * ``"in"``: the input channels a kernel reads (a new input channel's
          weights start at zero, so it does not change the layer's output);
        * ``"group_in"``: a grouped convolution's input axis, holding the
          channels of each output channel's own group (new ones start at zero);
        * ``"mid"``: a separable convolution's channels between its two
          kernels, each input channel's ``depth_multiplier`` channels in turn
          (new ones start at zero);
        * ``"channel"``: a depthwise kernel's slab of each input channel;
        * ``"out"``: the output channels (kernels, biases, per-channel scales);
        * ``"in:<i>"``: the channels of the call's input ``i`` (an attention
          layer's key and value; new ones start at zero);
        * ``"unit"`` / ``"unit_in"``: the units the layer creates inside and
          writes / reads (attention heads: a projection's head axis / the
          output projection's; new ones start from the initializer / at zero);
          ``"unit*<g>"`` / ``"unit_in*<g>"``: an axis of ``g`` consecutive
          entries per unit (a grouped-query layer's query heads of each
          key-value head).

        The default reads :meth:`specs_of`: a kernel's ``in_axis`` and
        ``out_axis``, a depthwise kernel's ``in_axis``, the last axis of
        biases and scales.
        """
        specs = self.specs_of(rec.layer)
        return [_spec_axes(specs.get(w.name)) for w in op_weights(rec.layer)]


def _spec_axes(spec):
    """The channel axes (see ``Handler.channel_axes``) of a weight described by ``spec``."""
    if spec is None:
        return {}
    if spec.kind == "kernel":
        return {spec.in_axis: "group_in" if spec.groups > 1 else "in", spec.out_axis: "out"}
    if spec.kind == "depthwise":
        return {spec.in_axis: "channel"}
    return {-1: "out"}


def op_weights(op):
    """An operation's weights (plain ``keras.ops`` operations have none)."""
    return getattr(op, "weights", [])


def const_weights(ctx, rec):
    """Count all of a layer's weights as width-independent constants."""
    if op_weights(rec.layer):
        ctx.add_term(rec, sum(math.prod(w.shape) for w in op_weights(rec.layer)), 0)


def elementwise_map(node):
    """Channel maps of an element-wise op: same channel, broadcast or prefix.

    An input with one channel broadcasts to every channel; a narrower one is
    added into the leading channels (``PrefixAdd``).
    """
    width = output_shape(node)[-1]
    maps = []
    for t in node.arguments.keras_tensors:
        c = t.shape[-1]
        if c == 1 and width != 1:
            maps.append(np.zeros(width, np.int64))
        elif c <= width:
            maps.append(np.concatenate([np.arange(c), np.full(width - c, -1)]))
        else:
            return None
    return maps
