"""The fitted latency model: predicted seconds per batch of one model at any widths."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from keras_precrop import _json, _tables
from keras_precrop.budget import costs as _costs
from keras_precrop.errors import LatencyModelMismatchError
from keras_precrop.graph import walker as _graph
from keras_precrop.latency.features import Features, signature

ROW = _costs.LATENCY_ROW  # the budget row's name in plans and cost models
_FORMAT = 2  # version of the JSON layout (2: per-column blocks, "out:ReLU@16")
_FIT_REMEDY = {"python": "kp.latency_model(model)",
               "cli": "`keras-precrop latency MODEL --json FILE`"}


@dataclasses.dataclass
class LatencyModel(_json.JsonDataclass):
    """A fitted latency model: predicted seconds per batch of one model at any widths.

    Attributes:
        model_name, signature, input_shape: identity of the model it was
            fitted on (the signature ignores widths, so it also fits that
            model's rebuilt copies).
        batch_size, runtime, training: what was timed.
        residual, ignore: width variables the variants varied.
        block: the features' rounded copies (columns ``<feature>@<block>``)
            round free widths up to multiples of this (1: no copies).
        ridge: the fit's ridge penalty (chosen by cross-validation).
        columns, coef: feature names (``macs:Conv2D``, ``out:ReLU``,
            ``const``, ``out:ReLU@16``, ...) and seconds per unit of each.
        error: relative prediction error on the held-out variants
            (``median``, ``worst``), on the fitted ones (``train_median``,
            ``train_worst``) and on the last refinement round's plans as
            the fit that made them predicted them, before they were timed
            (``plans_median``, ``plans_worst``; None without refinement).
        variants: label, measured and predicted seconds of every variant,
            whether it was held out and whether it is a refinement plan.
        template: the fitted model's width variables and feature terms, so
            :meth:`predict` works from JSON alone.
        fit_seconds: wall time of the whole measurement and fit.
    """

    model_name: str
    signature: str
    input_shape: list
    batch_size: int
    runtime: str
    training: bool
    residual: str
    ignore: list
    block: int
    ridge: float
    columns: list
    coef: list
    error: dict
    variants: list
    template: dict
    fit_seconds: float
    format: int = _FORMAT

    @property
    def seconds(self):
        """Predicted seconds per batch of the original model."""
        return self.predict(np.asarray(self.template["widths"]))

    def describe(self):
        """A short JSON-ready summary (what plans record)."""
        return {"model_name": self.model_name, "signature": self.signature,
                "batch_size": self.batch_size, "runtime": self.runtime,
                "training": self.training, "block": self.block,
                "error": {k: self.error[k] for k in ("median", "worst")},
                "units": "seconds per batch"}

    def check(self, graph, subject="latency_model", **argument):
        """Raise :class:`LatencyModelMismatchError` unless ``graph`` is this architecture.

        Args:
            graph: the walked model it is used for.
            subject: how the message names this latency model, e.g.
                ``"{latency_model}"`` with ``latency_model="fit.json"``.
            **argument: the argument a ``{...}`` subject names, with its value.
        """
        found = signature(graph)
        if found != self.signature:
            raise LatencyModelMismatchError(
                f"{subject} was fitted on model {self.model_name!r} (layer signature "
                f"{self.signature}), not on model {graph.model.name!r} (signature {found}); "
                "fit one for this model with {remedy}.", remedy=_FIT_REMEDY, **argument)

    def _features(self, graph):
        return Features.of(graph, self.columns)

    def cost_row(self, graph, subject="latency_model", **argument):
        """The predicted time as a :class:`~keras_precrop.budget.costs.CostRow` over ``graph``'s widths.

        ``subject`` and ``argument`` name this latency model in a mismatch
        error, as in :meth:`check`.
        """
        self.check(graph, subject, **argument)
        f = self._features(graph)
        return _costs.CostRow(ROW, np.asarray(self.coef)[f.col] * f.mult, f.a, f.b, f.layer,
                              f.blocks)

    def predict(self, x):
        """Predicted seconds per batch.

        Args:
            x: a Keras model of the fitted architecture (the original or a
                rebuilt copy, e.g. ``kp.precrop(model, ...)``), a
                :class:`~keras_precrop.Plan` or ``{variable name: width}``
                (width variables of the fitted ``residual``/``ignore`` settings), or a
                width vector in the order of ``template["names"]``.
        """
        if isinstance(x, keras.Model):
            known = _graph.names_of(x, self.ignore)
            if not known.issuperset(self.ignore):
                raise LatencyModelMismatchError(
                    f"predict's model {x.name!r} lacks the layers "
                    f"{sorted(set(self.ignore) - known)[:5]} this latency model was fitted "
                    f"with as ignore=; it was fitted on model {self.model_name!r}.")
            graph = _graph.walk(x, ignore=self.ignore, residual=self.residual)
            self.check(graph, "predict's model")
            cm = _costs.CostModel(graph)
            return float(self._evaluate(self._features(graph), cm.widths, cm.fixed))
        widths = getattr(x, "widths", x)
        names = self.template["names"]
        if isinstance(widths, dict):
            if set(widths) != set(names):
                raise LatencyModelMismatchError(
                    f"the widths name variables {sorted(set(widths) - set(names))[:5]} unknown to "
                    f"this latency model (fitted on {self.model_name!r} with residual="
                    f"{self.residual!r}, ignore={self.ignore}); pass the rebuilt model instead.")
            widths = [widths[n] for n in names]
        widths = np.asarray(widths, dtype=np.float64)
        if widths.shape != (len(names),):
            raise ValueError(f"widths must have one entry per width variable ({len(names)}), "
                             f"got shape {widths.shape}")
        features = Features.from_template(self.columns, self.template)
        return float(self._evaluate(features, widths, np.asarray(self.template["fixed"])))

    def _evaluate(self, features, widths, fixed):
        return features.matrix(widths, fixed)[0] @ np.asarray(self.coef)

    def summary(self, print_fn=print):
        """Print the fit: what was timed, its error and the largest coefficients' shares."""
        what = "training step" if self.training else "inference"
        print_fn(f'Latency model of "{self.model_name}": {what}, runtime {self.runtime}, '
                 f"batch {self.batch_size}, block {self.block}")
        print_fn(f"Original: {self.seconds * 1e3:.3f} ms per batch (predicted), "
                 f"{self.variants[0]['seconds'] * 1e3:.3f} ms measured")
        print_fn(f"Held-out error: median {self.error['median']:.1%}, worst "
                 f"{self.error['worst']:.1%} ({sum(v['held_out'] for v in self.variants)} of "
                 f"{len(self.variants)} variants); fitted in {self.fit_seconds:.0f} s")
        if self.error.get("plans_median") is not None:
            print_fn(f"Error on the last refinement round's plans, before refitting: median "
                     f"{self.error['plans_median']:.1%}, worst {self.error['plans_worst']:.1%}")
        t = self.template
        share = Features.from_template(self.columns, t).matrix(
            np.asarray(t["widths"]), np.asarray(t["fixed"]))[0] * self.coef
        rows = [("Feature", "Coefficient (s/unit)", "Share of time")]
        for j in np.argsort(-share):
            if share[j] > 0:
                rows.append((self.columns[j], f"{self.coef[j]:.3e}",
                             f"{share[j] / share.sum():.1%}"))
        for line in _tables.table(rows):
            print_fn(line)

    @classmethod
    def from_dict(cls, data):
        """A latency model from :meth:`to_dict`'s data (format 1 files too).

        Format 1 rounded every feature to ``block``; its columns are renamed
        ``<feature>@<block>``, which predicts the same.
        """
        version = data.get("format", _FORMAT)
        if version == 1:
            suffix = f"@{data['block']}" if data["block"] > 1 else ""
            data = {**data, "columns": [c + suffix for c in data["columns"]], "format": _FORMAT}
        elif version != _FORMAT:
            raise ValueError(f"latency model format {version} is not {_FORMAT}; refit it")
        return super().from_dict(data)
