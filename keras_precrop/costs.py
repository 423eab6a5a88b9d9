"""The bilinear cost model and ``profile(model)``.

Every layer's parameters and MACs are ``sum coef * w_a * w_b`` over width
variables (see ``graph.py``). :class:`CostModel` holds those terms as arrays so
one code path evaluates costs at the original widths (the profile), at
continuous width ratios (the solver) and at integer widths (a plan's
prediction of the rebuilt model).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from keras_precrop import graph as _graph

UNITS = "params: weights (trainable and not); MACs: multiply-accumulates per example (FLOPs = 2 x MACs)"


@dataclasses.dataclass
class LayerCost:
    """One layer's row of the profile."""

    name: str
    class_name: str
    params: int
    macs: int
    in_groups: list
    out_groups: list
    prunable: bool


class CostModel:
    """``const + sum_t coef_t * w[a_t] * w[b_t]`` for params and MACs.

    Index ``V`` (one past the last variable) stands for a factor of one.
    """

    def __init__(self, graph: _graph.ModelGraph):
        structure = graph.structure
        ctx = graph.ctx
        self.variables = structure.variables
        n = len(self.variables)
        coef, a, b, layer = [], [], [], []
        obj_var, obj_weight, obj_layer = [], [], []
        for i, rec in enumerate(graph.layers):
            for t in rec.terms:
                coef.append((t.params, t.macs))
                a.append(n if t.a is None else structure.var_of(rec, t.a, ctx))
                b.append(n if t.b is None else structure.var_of(rec, t.b, ctx))
                layer.append(i)
            for weight, seg in rec.objective:
                obj_var.append(structure.var_of(rec, seg, ctx))
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
        self.widths = np.array([v.width for v in self.variables], dtype=np.float64)
        self.fixed = np.array([v.fixed for v in self.variables], dtype=bool)
        self.bound = np.array(
            [-1 if v.bound is None else v.bound for v in self.variables], dtype=np.int64
        )

    def _term_values(self, widths):
        w = np.append(np.asarray(widths, dtype=np.float64), 1.0)
        return self.coef * (w[self.a] * w[self.b])[:, None]

    def totals(self, widths):
        """(params, MACs) at the given widths (one per variable)."""
        return self._term_values(widths).sum(axis=0)

    def per_layer(self, widths):
        """(L, 2) params and MACs of every layer at the given widths."""
        values = self._term_values(widths)
        out = np.zeros((self.n_layers, 2))
        np.add.at(out, self.layer, values)
        return out

    def objective(self, widths):
        """SynExp objective: sum over kernels of log density vs. the original."""
        w = np.asarray(widths, dtype=np.float64)
        return float(np.sum(self.obj_weight * np.log(w[self.obj_var] / self.widths[self.obj_var])))

    def layer_densities(self, widths):
        """Per-layer kernel density implied by the widths (product of ratios)."""
        w = np.asarray(widths, dtype=np.float64)
        logs = np.zeros(self.n_layers)
        np.add.at(logs, self.obj_layer,
                  self.obj_weight * np.log(w[self.obj_var] / self.widths[self.obj_var]))
        return np.exp(logs)


class ModelProfile:
    """Per-layer parameters, MACs and channel groups of a functional model.

    Attributes:
        layers: a :class:`LayerCost` per layer (nested models flattened, names
            joined with ``/``).
        groups: the width variables (:class:`graph.Variable`): channel groups,
            residual streams and, in prefix mode, the views of readers.
        total_params: equals ``model.count_params()``.
        total_macs: multiply-accumulates per example of all conv, depthwise
            and dense ops at the model's input shape (FLOPs = 2 x MACs).
    """

    def __init__(self, graph: _graph.ModelGraph):
        self.graph = graph
        self.cost = CostModel(graph)
        self.groups = self.cost.variables
        self.model_name = graph.model.name
        self.notes = list(graph.ctx.notes)
        widths = self.cost.widths
        rows = self.cost.per_layer(widths)
        structure, ctx = graph.structure, graph.ctx
        self.layers = []
        for rec, (params, macs) in zip(graph.layers, rows):
            def names(channels, rec=rec):
                return [self.groups[structure.var_of(rec, p.group, ctx)].name
                        for p in channels]
            ins = [n for ch in rec.inputs[0] for n in names(ch)]
            outs = [n for ch in rec.outputs[0] for n in names(ch)]
            prunable = any(
                not self.groups[structure.var_of(rec, s, ctx)].fixed
                for t in rec.terms for s in (t.a, t.b) if s is not None
            )
            self.layers.append(LayerCost(rec.path, rec.class_name, int(round(params)),
                                         int(round(macs)), ins, outs, prunable))
        self.total_params, self.total_macs = (int(round(x)) for x in self.cost.totals(widths))

    def __repr__(self):
        return (f"<ModelProfile {self.model_name!r}: {len(self.layers)} layers, "
                f"{self.total_params:,} params, {self.total_macs:,} MACs>")

    def summary(self, print_fn=print, only_costly=True):
        """Print a ``model.summary()``-style table.

        Args:
            print_fn: where each line goes.
            only_costly: skip layers with neither parameters nor MACs.
        """
        rows = [("Layer (type)", "Params", "MACs", "In group", "Out group", "Prunable")]
        for layer in self.layers:
            if only_costly and not (layer.params or layer.macs):
                continue
            rows.append((f"{layer.name} ({layer.class_name})", f"{layer.params:,}",
                         f"{layer.macs:,}", ",".join(layer.in_groups),
                         ",".join(layer.out_groups), "yes" if layer.prunable else "no"))
        lines = _table(rows)
        lines.append(f"Total params: {self.total_params:,}")
        lines.append(f"Total MACs:   {self.total_macs:,} ({2 * self.total_macs:,} FLOPs)")
        free = sum(not g.fixed for g in self.groups)
        lines.append(f"Width variables: {len(self.groups)} ({free} prunable)")
        print_fn(f'Profile: "{self.model_name}"')
        for line in lines + [f"Note: {n}" for n in self.notes]:
            print_fn(line)

    def to_dict(self):
        """JSON-ready dict of the profile."""
        return {
            "model": self.model_name,
            "units": UNITS,
            "total_params": self.total_params,
            "total_macs": self.total_macs,
            "notes": self.notes,
            "layers": [dataclasses.asdict(l) for l in self.layers],
            "groups": [
                {"name": g.name, "width": g.width, "fixed": g.fixed, "kind": g.kind,
                 "bound": None if g.bound is None else self.groups[g.bound].name,
                 "layers": list(g.layers)}
                for g in self.groups
            ],
        }

    def to_json(self, **kwargs):
        return json.dumps(self.to_dict(), **kwargs)


def _table(rows):
    """Format rows as a box-drawing table like ``model.summary()``."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(r):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        return "| " + " | ".join(cells) + " |"

    return [rule, fmt(rows[0]), rule.replace("-", "="), *map(fmt, rows[1:]), rule]


def profile(model, *, ignore=(), residual="prefix"):
    """Profile a functional Keras model: costs per layer and channel groups.

    Args:
        model: a built functional or Sequential model with a defined input
            shape (the batch dimension excepted).
        ignore: layer names whose channels must stay fixed (also lets an
            unsupported layer through as an opaque block).
        residual: ``"prefix"`` (PreCrop: readers and writers of a residual
            stream get their own widths) or ``"tie"``.

    Returns:
        A :class:`ModelProfile`.
    """
    return ModelProfile(_graph.walk(model, ignore=ignore, residual=residual))
