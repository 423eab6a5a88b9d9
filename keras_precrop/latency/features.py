"""Latency features: per-layer-class sums of bilinear terms over the width variables.

The fitted time of a model is linear in these columns (``macs:<class>``,
``out:<class>``, ``in:<class>``, ``const`` and their block-rounded copies
``<feature>@<block>``), each a sum of ``mult * w_a * w_b`` terms, so a
latency model is one more :class:`~keras_precrop.budget.costs.CostRow`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np

from keras_precrop.budget import costs as _costs

ALIASES = {"PrefixAdd": "Add"}  # rebuilt layers that stand for the layer they replace
UNCOSTED = ("ChannelSlice",)  # charged to its reader's input elements instead


def _class_key(rec):
    """Layer class a record's time is charged to (None: charged elsewhere)."""
    name = rec.class_name
    return None if name in UNCOSTED else ALIASES.get(name, name)


def _block_of(column):
    """Block size a feature column rounds free widths up to (``out:ReLU@16``: 16; no ``@``: 1)."""
    return int(column.partition("@")[2] or 1)


@dataclasses.dataclass
class Features:
    """Feature columns of one walked model as terms over its width variables.

    Column ``col[t]`` gains ``mult[t] * r(w)[a[t]] * r(w)[b[t]]`` (index
    ``V``: a factor of one), where ``r`` rounds the free widths up to the
    column's block (named ``<feature>@<block>``; unrounded without ``@``);
    ``layer[t]`` is the term's layer (an index into ``graph.layers``).
    """

    columns: list
    col: np.ndarray
    mult: np.ndarray
    a: np.ndarray
    b: np.ndarray
    layer: np.ndarray

    @classmethod
    def of(cls, graph, columns=None):
        """Unrounded features of ``graph``; with ``columns`` given, those (rounded ones included)."""
        one = len(graph.variables)
        position = {id(rec): i for i, rec in enumerate(graph.layers)}
        index = {}
        terms = []

        def add(column, mult, a, b, layer):
            if mult:
                terms.append((index.setdefault(column, len(index)), mult, a, b, layer))

        def var(rec, seg, as_input):
            if seg is None:
                return one
            # A residual reader sees its own view of the stream.
            return graph.variable(rec, seg) if as_input else graph.group_variable(seg)

        for call in graph.calls:
            rec = call.record
            key = _class_key(rec)
            if key is None:
                continue
            i = position[id(rec)]
            for kind, tensors, keys in (("out", call.node.outputs, call.outputs),
                                        ("in", call.node.arguments.keras_tensors, call.inputs)):
                for t, k in zip(tensors, keys):
                    pixels = math.prod(t.shape[1:-1])
                    for p in graph.tensor_channels[k]:
                        add(f"{kind}:{key}", pixels * p.mult * graph.scale(p.segment),
                            var(rec, p.segment, kind == "in"), one, i)
            add("const", 1.0, one, one, i)
        for i, rec in enumerate(graph.layers):
            key = _class_key(rec)
            for t in rec.terms if key is not None else ():
                add(f"macs:{key}", t.macs * graph.scale(t.a) * graph.scale(t.b),
                    var(rec, t.a, True), var(rec, t.b, True), i)
        col, mult, a, b, layer = np.array(terms, dtype=np.float64).reshape(-1, 5).T
        features = cls(list(index), col.astype(np.int64), mult, a.astype(np.int64),
                       b.astype(np.int64), layer.astype(np.int64))
        return features if columns is None else features.select(columns)

    @classmethod
    def from_template(cls, columns, template):
        """Features stored in a :class:`LatencyModel`'s template (layers unknown)."""
        return cls(columns, *(np.asarray(template[k]) for k in ("col", "mult", "a", "b")),
                   np.zeros(len(template["col"]), dtype=np.int64))

    def select(self, columns):
        """The given columns of these unrounded features, in that order.

        A column ``<feature>@<block>`` has the terms of ``<feature>``; a
        feature this model lacks has none.
        """
        index = {c: j for j, c in enumerate(self.columns)}
        parts = [(j, np.flatnonzero(self.col == index.get(c.partition("@")[0], -1)))
                 for j, c in enumerate(columns)]
        take = np.concatenate([terms for _, terms in parts]).astype(np.int64)
        col = np.concatenate([np.full(len(terms), j) for j, terms in parts]).astype(np.int64)
        return Features(list(columns), col, self.mult[take], self.a[take], self.b[take],
                         self.layer[take])

    def with_block(self, block, fixed):
        """These unrounded features and, for ``block`` > 1, a copy of each rounded up to it.

        Columns without a free width (the per-call constant, fixed widths)
        get no copy: it would repeat them.
        """
        free = np.append(~np.asarray(fixed), False)
        varies = [bool(np.any(free[self.a[self.col == j]] | free[self.b[self.col == j]]))
                  for j in range(len(self.columns))]
        rounded = [f"{c}@{block}" for c, v in zip(self.columns, varies) if v and block > 1]
        return self.select(self.columns + rounded)

    @property
    def blocks(self):
        """Block size of every term (its column's)."""
        return np.array([_block_of(c) for c in self.columns], dtype=np.int64)[self.col]

    def matrix(self, widths, fixed):
        """(n, columns) feature values at (n, V) widths."""
        w = np.atleast_2d(np.asarray(widths, dtype=np.float64))
        values = _costs.term_factors(w, fixed, self.a, self.b, self.blocks) * self.mult
        out = np.zeros((len(w), len(self.columns)))
        for j in range(len(self.columns)):
            out[:, j] = values[:, self.col == j].sum(axis=1)
        return out


def signature(graph):
    """Identity of a model's architecture, the same for its rebuilt (pruned) copies.

    A hash of the input shapes and every costed layer's path and class (the
    ``ChannelSlice`` layers a rebuild adds are left out, a ``PrefixAdd``
    counts as the ``Add`` it replaces); widths do not enter.
    """
    fn = graph.functional
    layers = sorted((rec.path, _class_key(rec)) for rec in graph.layers if _class_key(rec))
    text = json.dumps([[list(t.shape[1:]) for t in fn.inputs], layers])
    return hashlib.sha1(text.encode()).hexdigest()[:16]
