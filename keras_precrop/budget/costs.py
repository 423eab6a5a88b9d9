"""The bilinear cost model and ``profile(model)``.

Every layer's parameters and MACs are ``sum coef * w_a * w_b`` over width
variables (see ``graph/channels.py`` for the vocabulary). :class:`CostModel` holds those terms as arrays so
one code path evaluates costs at the original widths (the profile), at
continuous width ratios (the solver) and at integer widths (a plan's
prediction of the rebuilt model).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import keras
import numpy as np

# Not ``from keras_precrop import _tables``: that goes through the package's lazy __getattr__,
# which registers the Keras classes, importing the planning floor while this module is half-loaded.
from keras_precrop._tables import kept_whole_lines, not_shown, table
from keras_precrop.budget.kinds import KINDS
from keras_precrop.budget.widths import WidthProblem
from keras_precrop.errors import (
    ArgumentError,
    ArgumentTypeError,
    UnsupportedLayerError,
    _before_remedy,
)
from keras_precrop.graph import walker as _graph

# The name of a latency model's budget row, in plans and cost models (budget.kinds declares it).
LATENCY_ROW = next(kind.row for kind in KINDS if kind.timed)
UNITS = "params: weights (trainable and not); MACs: multiply-accumulates per example (FLOPs = 2 x MACs)"


@dataclasses.dataclass
class LayerCost:
    """One layer's row of the profile.

    Attributes:
        name: the layer's name (``outer/inner`` inside nested models).
        class_name: the layer's class.
        params: its parameters.
        macs: its multiply-accumulates per example.
        in_variables: names of the width variables of its input channels, in order.
        out_variables: names of the width variables of its output channels.
        prunable: some width its cost depends on may change.
        in_scales: channels per unit of each of ``in_variables`` (1 but for a
            tensor split into pieces: n for n equal pieces, whose variable
            counts one piece).
        out_scales: the same for ``out_variables``.
    """

    name: str
    class_name: str
    params: int
    macs: int
    in_variables: list
    out_variables: list
    prunable: bool
    in_scales: list
    out_scales: list


@dataclasses.dataclass(frozen=True)
class CostRow:
    """One more budget row over a :class:`CostModel`'s width variables.

    ``value(w) = sum_t coef[t] * r(w)[a[t]] * r(w)[b[t]]``: the same bilinear
    form as params and MACs (index ``V`` is a factor of one, so a term may be
    linear or constant), where ``r`` rounds the widths of free variables up
    to multiples of the term's ``block`` (hardware that computes in blocks of
    channels, e.g. 16 for oneDNN's AVX-512 kernels; one block for all terms
    or one per term). The continuous width program sees the unrounded form.
    A predicted latency is such a row (see ``keras_precrop.latency``).
    """

    name: str
    coef: np.ndarray   # (T,) cost of a term per unit of w_a * w_b
    a: np.ndarray      # (T,) int variable index, V for a factor of one
    b: np.ndarray      # (T,) int variable index, V for a factor of one
    layer: np.ndarray  # (T,) int index of the layer the term belongs to
    block: int | np.ndarray = 1  # block size, of all terms or (T,) per term


def term_factors(widths, fixed, a, b, block=1):
    """``r(w)[a] * r(w)[b]`` per term for widths of shape (..., V).

    ``r`` rounds the free widths (``~fixed``) up to multiples of the term's
    block (``block``: one for all terms or one per term) and appends a
    factor of one at index ``V``.
    """
    w = np.asarray(widths, dtype=np.float64)
    blocks = np.broadcast_to(block, np.shape(a))
    out = np.empty(w.shape[:-1] + np.shape(a))
    for size in np.unique(blocks):
        r = np.where(fixed, w, np.ceil(w / size - 1e-9) * size) if size > 1 else w
        r = np.concatenate([r, np.ones(r.shape[:-1] + (1,))], axis=-1)
        terms = blocks == size
        out[..., terms] = r[..., a[terms]] * r[..., b[terms]]
    return out


class CostModel:
    """``const + sum_t coef_t * w[a_t] * w[b_t]`` for params and MACs.

    Index ``V`` (one past the last variable) stands for a factor of one.
    :meth:`with_rows` adds further budget rows (:class:`CostRow`), whose
    values follow params and MACs in :meth:`totals` and :meth:`per_layer`.
    """

    def __init__(self, graph: _graph.ModelGraph):
        self.variables = graph.variables
        n = len(self.variables)
        coef, a, b, layer = [], [], [], []
        obj_var, obj_weight, obj_layer = [], [], []
        for i, rec in enumerate(graph.layers):
            for t in rec.terms:
                units = graph.scale(t.a) * graph.scale(t.b)  # channels per variable unit
                coef.append((t.params * units, t.macs * units))
                a.append(n if t.a is None else graph.variable(rec, t.a))
                b.append(n if t.b is None else graph.variable(rec, t.b))
                layer.append(i)
            for weight, seg in rec.objective:
                obj_var.append(graph.variable(rec, seg))
                obj_weight.append(weight)
                obj_layer.append(i)
        self.coef = np.asarray(coef, dtype=np.float64).reshape(-1, 2)
        self.a = np.asarray(a, dtype=np.int64)
        self.b = np.asarray(b, dtype=np.int64)
        self.layer = np.asarray(layer, dtype=np.int64)
        self.obj_var = np.asarray(obj_var, dtype=np.int64)
        self.obj_weight = np.asarray(obj_weight, dtype=np.float64)
        self.obj_layer = np.asarray(obj_layer, dtype=np.int64)
        self.n_layers = len(graph.layers)
        self.layer_kernels = np.array([max(rec.kernels, 1) for rec in graph.layers], dtype=np.float64)
        self.widths = np.array([v.width for v in self.variables], dtype=np.float64)
        self.fixed = np.array([v.fixed for v in self.variables], dtype=bool)
        self.bound = _live_bounds(self.variables, self.fixed)
        self.rows = ()

    def with_rows(self, rows):
        """A copy of this cost model with extra budget rows (:class:`CostRow`)."""
        new = copy.copy(self)
        new.rows = tuple(rows)
        return new

    @property
    def row_names(self):
        """Names of the columns of :meth:`totals`: params, MACs, then the extra rows."""
        return ("params", "macs", *(row.name for row in self.rows))

    @property
    def unrounded(self):
        """The variables a row's blocks never round: fixed widths, and attention heads, which
        are counted in whole heads, not in channels a kernel computes in blocks of."""
        return self.fixed | np.array([v.kind == "heads" for v in self.variables], dtype=bool)

    def _row_factors(self, row, widths):
        """``r(w)_a * r(w)_b`` of every term of an extra row (free channel widths rounded up)."""
        return term_factors(widths, self.unrounded, row.a, row.b, row.block)

    def _factors(self, widths):
        """``w_a * w_b`` of every term, for widths of shape (..., V)."""
        w = np.asarray(widths, dtype=np.float64)
        w = np.concatenate([w, np.ones(w.shape[:-1] + (1,))], axis=-1)
        return w[..., self.a] * w[..., self.b]

    def totals(self, widths):
        """(params, MACs, extra rows...) at the given widths (one per variable).

        ``widths`` may also be a (n, V) batch; the result is then (n, 2 + rows).
        """
        out = self._factors(widths) @ self.coef
        extra = [self._row_factors(row, widths) @ row.coef for row in self.rows]
        return np.concatenate([out, np.stack(extra, axis=-1)], axis=-1) if extra else out

    def per_layer(self, widths):
        """(L, 2 + rows) params, MACs and extra rows of every layer at the given widths."""
        out = np.zeros((self.n_layers, 2 + len(self.rows)))
        np.add.at(out[:, :2], self.layer, self.coef * self._factors(widths)[:, None])
        for k, row in enumerate(self.rows, start=2):
            np.add.at(out[:, k], row.layer, row.coef * self._row_factors(row, widths))
        return out

    def objective(self, widths):
        """SynExp objective: sum over kernels of log density vs. the original.

        A float for one width vector, an (n,) array for a (n, V) batch.
        """
        w = np.asarray(widths, dtype=np.float64)
        logs = np.log(w[..., self.obj_var] / self.widths[self.obj_var])
        total = np.sum(self.obj_weight * logs, axis=-1)
        return float(total) if total.ndim == 0 else total

    def balance_pairs(self):
        """(E, 2) pairs of free variables that are adjacent widths.

        A kernel's input and output widths (a term with params in both) and
        a residual view and its stream: the places where the paper warns
        that "the number of the input and output channels can change
        dramatically", which the SynExp objective alone does not see.
        """
        n = len(self.widths)
        kernel = (self.coef[:, 0] > 0) & (self.a < n) & (self.b < n) & (self.a != self.b)
        view = np.flatnonzero(self.bound >= 0)
        pairs = np.concatenate([np.stack([self.a[kernel], self.b[kernel]], axis=1),
                                np.stack([view, self.bound[view]], axis=1)])
        pairs = pairs[~self.fixed[pairs].any(axis=1)]
        return np.unique(np.sort(pairs, axis=1), axis=0).reshape(-1, 2)

    def held_widths(self):
        """(V,) the narrowest width each variable may take for the fixed ones bound to it, 0 where
        none: a residual stream is never narrower than a layer kept whole that writes into it
        (or reads it), whose width cannot follow the stream down."""
        held = np.zeros(len(self.widths))
        kept = np.flatnonzero(self.fixed & (self.bound >= 0))
        np.maximum.at(held, self.bound[kept], self.widths[kept])
        return held

    def width_problem(self, min_widths, upper, balance=None):
        """The solver's program over the free variables.

        Args:
            min_widths: smallest allowed width of every variable.
            upper: cap on width ratios (1.0 for PreCrop, ``None``: no cap).
            balance: if set, the width ratios (new / original) of every pair
                of :meth:`balance_pairs` differ by at most this factor.

        Returns:
            ``(WidthProblem, log_upper)``: the problem and the per-variable
            upper bounds on log ratios to pass to ``solve_widths``. A bound
            between a free and a fixed variable becomes a plain bound.
        """
        free = np.flatnonzero(~self.fixed)
        index = np.full(len(self.widths) + 1, -1)
        index[free] = np.arange(len(free))
        c = np.append(self.widths, 1.0)
        a, b, coef = self._all_terms()
        coef = coef * (c[a] * c[b])[:, None]
        term_vars = np.stack([index[a], index[b]], axis=1)
        const_rows = np.all(term_vars < 0, axis=1)
        keep = np.isin(self.obj_var, free)
        log_upper = np.full(len(free), np.inf if upper is None else math.log(upper))
        least = np.maximum(np.asarray(min_widths, dtype=np.float64), self.held_widths())
        lower = np.log(least[free] / self.widths[free])
        leq = []
        for v, b in enumerate(self.bound):
            if b < 0 or self.fixed[v]:  # a fixed writer's bound is held_widths'
                continue
            if self.fixed[b]:  # a free view of a fixed stream
                log_upper[index[v]] = min(log_upper[index[v]], math.log(self.widths[b] / self.widths[v]))
            else:
                leq.append((index[v], index[b]))
        offset = [0.0] * len(leq)
        if balance is not None:
            for i, j in index[self.balance_pairs()]:
                leq += [(i, j), (j, i)]
                offset += [math.log(balance)] * 2
        problem = WidthProblem(
            names=[self.variables[v].name for v in free],
            widths=self.widths[free],
            term_coef=coef[~const_rows],
            term_vars=term_vars[~const_rows],
            const=coef[const_rows].sum(axis=0),
            obj_var=index[self.obj_var[keep]],
            obj_weight=self.obj_weight[keep],
            leq=np.asarray(leq, dtype=np.int64).reshape(-1, 2),
            lower=lower,
            rows=self.row_names,
            leq_offset=offset,
        )
        return problem, log_upper

    def _all_terms(self):
        """``(a, b, coef)`` of params/MACs terms and extra rows' terms, one column per row."""
        if not self.rows:
            return self.a, self.b, self.coef
        k = 2 + len(self.rows)
        blocks = [np.pad(self.coef, ((0, 0), (0, k - 2)))]
        for j, row in enumerate(self.rows, start=2):
            block = np.zeros((len(row.coef), k))
            block[:, j] = row.coef
            blocks.append(block)
        return (np.concatenate([self.a, *(row.a for row in self.rows)]),
                np.concatenate([self.b, *(row.b for row in self.rows)]),
                np.concatenate(blocks))

    def layer_densities(self, widths):
        """Per-layer kernel density implied by the widths: the share of a kernel's weights kept.

        A kernel's density is the product of its input and output width ratios (SynExp's
        ``p_l``); a layer of several kernels (attention's query, key, value and output) gets
        their geometric mean, so that a density reads as the share of the layer's kernel
        weights kept whatever the number of kernels (their product would shrink with it).
        """
        w = np.asarray(widths, dtype=np.float64)
        logs = np.zeros(self.n_layers)
        np.add.at(logs, self.obj_layer,
                  self.obj_weight * np.log(w[self.obj_var] / self.widths[self.obj_var]))
        return np.exp(logs / self.layer_kernels)


def _live_bounds(variables, fixed):
    """(V,) the variable each one may never be wider than (``-1``: none), as the cost model keeps it.

    A bound between two fixed widths constrains nothing and is dropped: the walk lets one stand
    even between different units of channels (a kept-whole residual add onto a piece of an
    unequal split: the piece counts two units of its stream, the writer's 16 channels sixteen),
    where clipping one fixed width to the other, as the integer grid clips views and writers to
    their streams, would silently narrow a layer that must stay whole.
    """
    bound = np.array([-1 if v.bound is None else v.bound for v in variables], dtype=np.int64)
    both = (bound >= 0) & fixed & fixed[np.maximum(bound, 0)]
    return np.where(both, -1, bound)


class ModelProfile:
    """Per-layer parameters, MACs and width variables of a functional model.

    Attributes:
        graph: the walked model (:class:`~keras_precrop.graph.ModelGraph`), which
            refers to the model and its trace: a profile keeps them alive until
            it is dropped (a plan, by contrast, holds plain data alone).
        layers: a :class:`LayerCost` per layer (nested models flattened, names
            joined with ``/``).
        variables: the width variables (:class:`graph.Variable`): channel
            groups, residual streams and, in prefix mode, the views of readers.
        total_params: equals ``model.count_params()``.
        total_macs: multiply-accumulates per example of all conv, depthwise
            and dense ops at the model's input shape (FLOPs = 2 x MACs),
            opaque layers' (ignored or registered ``"fixed"``) as their
            backend counts them.
        unknown_macs: paths of the opaque layers whose MACs the backend
            cannot count (left out of ``total_macs``; see
            :func:`refuse_unknown_costs`).
        ignore: the names of the layers kept whole as ``ignore=`` said, with
            ``"auto"`` resolved (see :func:`resolve_ignore`).
        kept_whole: ``{name: why}`` of the layers ``ignore="auto"`` kept whole.
    """

    def __init__(self, graph: _graph.ModelGraph, ignore=(), kept_whole=None):
        self.graph = graph
        self.ignore, self.kept_whole = list(ignore), dict(kept_whole or {})
        self.cost = CostModel(graph)
        self.variables = self.cost.variables
        self.model_name = graph.model.name
        self.notes = list(graph.notes)
        self.unknown_macs = [rec.path for rec in graph.layers if rec.macs_unknown]
        widths = self.cost.widths
        rows = self.cost.per_layer(widths)
        self.layers = []
        for rec, (params, macs) in zip(graph.layers, rows):
            ins = [p for ch in rec.inputs[0] for p in ch]
            outs = [p for ch in rec.outputs[0] for p in ch]
            prunable = any(
                not self.variables[graph.variable(rec, s)].fixed
                for t in rec.terms for s in (t.a, t.b) if s is not None
            )
            self.layers.append(LayerCost(
                rec.path, rec.class_name, int(round(params)), int(round(macs)),
                [self.variables[graph.variable(rec, p.segment)].name for p in ins],
                [self.variables[graph.variable(rec, p.segment)].name for p in outs], prunable,
                [graph.scale(p.segment) for p in ins], [graph.scale(p.segment) for p in outs]))
        self.total_params, self.total_macs = (int(round(x)) for x in self.cost.totals(widths))

    def width_problem(self, upper=1.0, min_channels=1):
        """The channel-width program of this model for ``solve_widths``.

        Returns ``(problem, log_upper)``; pass ``upper=log_upper`` to
        ``solve_widths``. ``upper=None`` lets widths grow (PreConfig).
        """
        cm = self.cost
        return cm.width_problem(np.where(cm.fixed, cm.widths, np.minimum(cm.widths, min_channels)),
                                upper)

    def __repr__(self):
        return (f"<ModelProfile {self.model_name!r}: {len(self.layers)} layers, "
                f"{self.total_params:,} params, {self.total_macs:,} MACs>")

    def summary(self, print_fn=print, only_costly=True, show_all_hint="only_costly=False"):
        """Print a ``model.summary()``-style table.

        Args:
            print_fn: where each line goes.
            only_costly: skip layers with neither parameters nor MACs
                (activations, adds, pooling); a note under the table says
                how many were left out.
            show_all_hint: how the caller shows every layer, for that note
                (the command line passes its ``--all`` flag).
        """
        rows = [("Layer (type)", "Params", "MACs", "In variables", "Out variables", "Prunable")]
        hidden = 0
        for layer in self.layers:
            if only_costly and not (layer.params or layer.macs):
                hidden += 1
                continue
            rows.append((f"{layer.name} ({layer.class_name})", f"{layer.params:,}",
                         f"{layer.macs:,}", ",".join(layer.in_variables),
                         ",".join(layer.out_variables), "yes" if layer.prunable else "no"))
        lines = table(rows) + not_shown(hidden, "layer{s} without params or MACs", show_all_hint)
        lines.append(f"Total params: {self.total_params:,}")
        lines.append(f"Total MACs:   {self.total_macs:,} ({2 * self.total_macs:,} FLOPs)")
        free = sum(not v.fixed for v in self.variables)
        lines.append(f"Width variables: {len(self.variables)} ({free} prunable)")
        print_fn(f'Profile: "{self.model_name}"')
        for line in lines + [f"Note: {n}" for n in self.notes] + kept_whole_lines(self.kept_whole):
            print_fn(line)

    def to_dict(self):
        """JSON-ready dict of the profile."""
        return {
            "model": self.model_name,
            "units": UNITS,
            "total_params": self.total_params,
            "total_macs": self.total_macs,
            "notes": self.notes,
            "ignore": self.ignore,
            "kept_whole": self.kept_whole,
            "layers": [dataclasses.asdict(row) for row in self.layers],
            "variables": [
                {"name": v.name, "width": v.width, "fixed": v.fixed, "kind": v.kind,
                 "bound": None if v.bound is None else self.variables[v.bound].name,
                 "layers": list(v.layers)}
                for v in self.variables
            ],
        }

    def to_json(self, **kwargs):
        return json.dumps(self.to_dict(), **kwargs)


def refuse_unknown_costs(prof, named):
    """Refuse budgets that count MACs or time when some layer's MACs are unknown.

    An opaque layer whose MACs the backend cannot count (``prof.unknown_macs``:
    a recurrent layer's loop, an op without a registered cost) would make a
    MAC budget, and a latency model fitted on MACs, silently wrong; a
    parameter budget does not depend on them.

    Args:
        prof: the model's :class:`ModelProfile`.
        named: ``{argument: value}`` of the budgets that count MACs or time
            (``flops``, ``max_macs``, ``latency``), as the user gave them;
            ``None`` values are budgets not given.

    Raises:
        ArgumentError: naming the budgets' arguments and the layers.
    """
    named = {name: value for name, value in named.items() if value is not None}
    if not prof.unknown_macs or not named:
        return
    subject = " and ".join("{" + name + "}" for name in named)
    layers = ", ".join(repr(path) for path in prof.unknown_macs)
    raise ArgumentError(
        f"{subject} cannot be met on model {prof.model_name!r}: the MACs of layer(s) {layers}, "
        f"kept whole (ignore= or a 'fixed' handler), cannot be counted by the "
        f"{keras.backend.backend()} backend, so the model's MACs are unknown. Give a "
        "parameter budget alone ({params:=} or {max_params:=}), or describe the layer "
        "with keras_precrop.register_handler(...) so that its MACs are known.", **named)


def resolve_budget(kind, values, original, can_grow):
    """The budget of ``kind`` (a :class:`~keras_precrop.budget.kinds.BudgetKind`) from its ratio of
    the original or its absolute value, as the user gave them.

    Args:
        kind: the kind of budget.
        values: ``{keyword: value}`` of the budget arguments (``kinds.given``);
            ``None`` values are not given.
        original: the original model's parameters / MACs (1.0 for a time,
            whose original is known only once a latency model is fitted).
        can_grow: whether widths may exceed the original (PreConfig); if
            not, a budget above the original is refused, since it would
            silently return the model unchanged.

    Returns:
        ``(budget, (argument name, value))``, the budget as params and MACs
        in float integers, a time as the ratio times ``original``; or
        ``None`` when neither argument is given.

    Raises:
        ArgumentError, ArgumentTypeError: naming the argument as the user
            passed it (``flops=0``), which the command line shows as its flag.
    """
    ratio, absolute = values.get(kind.ratio), values.get(kind.absolute) if kind.absolute else None
    if ratio is not None and absolute is not None:
        raise ArgumentError(f"Give either {{{kind.ratio}}} (a ratio) or {{{kind.absolute}}} (an "
                            "absolute count), not both.",
                            **{kind.ratio: ratio, kind.absolute: absolute})
    if ratio is None and absolute is None:
        return None
    is_ratio = ratio is not None
    name, value = (kind.ratio, ratio) if is_ratio else (kind.absolute, absolute)
    what = (f"ratio of the original model's {kind.ratio_of} (e.g. 0.5)" if is_ratio
            else f"number of {kind.unit}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ArgumentTypeError(f"{{{name}}} must be a {what}.", **{name: value})
    if not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"{{{name}}} must be a positive, finite {what}.", **{name: value})
    if not can_grow and (value > 1 if is_ratio else value > original):
        size = (f"{value:.0%} of the original model's {kind.ratio_of}" if is_ratio
                else f"more than the original model's {original:,} {kind.unit}")
        raise ArgumentError(
            f"{{{name}}} asks for {size}, but PreCrop only removes channels: the model would "
            "come back unchanged. Use reconfigure (PreConfig) to let layers grow.",
            limit=1.0 if is_ratio else original, **{name: value})
    budget = float(value) * original if is_ratio else float(value)
    if not kind.timed:  # params and MACs are integers: round away float noise
        budget = float(math.floor(budget * (1 + 1e-12)))
    return budget, (name, value)


def profile(model, *, ignore=(), residual="prefix", attention="heads"):
    """Profile a functional Keras model: costs per layer and width variables.

    Args:
        model: a built functional or Sequential model with a defined input
            shape (the batch dimension excepted).
        ignore: layer names whose channels must stay fixed (also lets an
            unsupported layer through as an opaque block); ``"auto"``, alone
            or among the names: every layer the walk refuses with the remedy
            ``ignore=[...]`` is kept whole too (see :func:`resolve_ignore`;
            the profile's ``ignore`` and ``kept_whole`` say which and why).
        residual: ``"prefix"`` (PreCrop: readers and writers of a residual
            stream get their own widths) or ``"tie"``.
        attention: ``"heads"`` (attention layers lose whole heads) or
            ``"head_dims"`` (they keep their heads and narrow each).

    Returns:
        A :class:`ModelProfile`.
    """
    return ModelProfile(*resolve_ignore(model, ignore, residual, attention))


# Walks of ignore="auto" at most: keeping a layer whole can reveal another refusal (a check that
# runs once every layer has walked), so each walk keeps whole what the last one refused.
_AUTO_ROUNDS = 8


def resolve_ignore(model, ignore, residual, attention="heads"):
    """The walk of ``model`` with ``ignore``, ``"auto"`` resolved into layer names.

    Without ``"auto"`` among ``ignore``, one walk with its names. With it, a
    walk refused by an :class:`~keras_precrop.errors.UnsupportedLayerError`
    whose remedy is ``ignore=[names]`` is made again with those layers kept
    whole too, until it passes (at most ``_AUTO_ROUNDS`` walks). The user's
    own names always stay: "auto" only adds.

    Args:
        model: as for :func:`profile`.
        ignore: as for :func:`profile`.
        residual, attention: as for :func:`profile`.

    Returns:
        ``(graph, names, kept_whole)``: the walk; the names it kept whole, the
        user's first (what a plan records as ``plan.ignore``, so applying it
        walks the same); ``{name: why}`` of those "auto" added, each with the
        refusal's own sentence.

    Raises:
        UnsupportedLayerError: a refusal that keeping layers whole does not
            remedy (no ``ignore=``, or only names already kept whole), or one
            still there after the last walk, as the walk raised it.
    """
    names = _graph.ignore_names(ignore)
    auto = _graph.AUTO in names
    names, kept_whole = [name for name in names if name != _graph.AUTO], {}
    for _ in range(_AUTO_ROUNDS if auto else 1):
        try:
            graph = _graph.walk(model, ignore=names, residual=residual, attention=attention)
            return graph, names, kept_whole
        except UnsupportedLayerError as err:
            offered = [name for name in err.arguments.get("ignore") or () if name not in names]
            if not auto or not offered:
                raise
            kept_whole.update(_refused_for(err, offered))
            names, refusal = names + offered, err
    raise refusal


def _refused_for(error, names):
    """``{name: why}``: the sentence of ``error`` that refuses each of ``names``.

    An error of several refusals (``UnsupportedLayerError.together``) lists
    each on a line of its own, which names its layer; a single refusal is its
    sentences before the remedy.
    """
    lines = [line[4:] for line in error.template.splitlines() if line.startswith("  - ")]
    if not lines:
        return dict.fromkeys(names, _before_remedy(error))
    named = {name: [line for line in lines if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", line)]
             for name in names}
    return {name: found[0] if found else error.template.splitlines()[0] for name, found in named.items()}
