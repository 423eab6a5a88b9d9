"""The fitted latency model: predicted seconds per batch of one model at any widths."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings

import keras
import numpy as np

from keras_precrop import _json, _tables
from keras_precrop.budget import costs as _costs
from keras_precrop.errors import InfeasibleBudgetError, LatencyModelMismatchError
from keras_precrop.graph import walker as _graph
from keras_precrop.latency import timing as _timing
from keras_precrop.latency.features import Features, signature

ROW = _costs.LATENCY_ROW  # the budget row's name in plans and cost models
_FORMAT = 2  # version of the JSON layout (2: per-column blocks, "out:ReLU@16")
_FIT_REMEDY = {"python": "kp.latency_model(model)",
               "cli": "`keras-precrop latency MODEL --json FILE`"}


@contextlib.contextmanager
def floor_said(lm):
    """Raises a plan's :class:`InfeasibleBudgetError` with ``lm``'s latency floor said plainly
    (:meth:`LatencyModel.unreachable`); with ``lm`` None, as it is."""
    try:
        yield
    except InfeasibleBudgetError as err:
        if lm is None:
            raise
        raise lm.unreachable(err) from None


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
        backend, device_kind, device_name, precision: where it was timed:
            the Keras backend, the device's kind (``"cpu"``, ``"gpu"``,
            ``"tpu"``) and name (``"NVIDIA H200"``, the CPU's model) and the
            model's dtype policy (``"float32"``, ``"mixed_float16"``); None
            where unknown (a custom ``timer``, files written before they were
            recorded).
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
    backend: str | None = None
    device_kind: str | None = None
    device_name: str | None = None
    precision: str | None = None
    format: int = _FORMAT

    @property
    def seconds(self):
        """Predicted seconds per batch of the original model."""
        return self.predict(np.asarray(self.template["widths"]))

    def describe(self):
        """A short JSON-ready summary (what plans record)."""
        return {"model_name": self.model_name, "signature": self.signature,
                "batch_size": self.batch_size, "runtime": self.runtime,
                "training": self.training, "block": self.block, "backend": self.backend,
                "device_kind": self.device_kind, "device_name": self.device_name,
                "precision": self.precision,
                "error": {k: self.error[k] for k in ("median", "worst")},
                "units": "seconds per batch"}

    def check(self, graph, subject="latency_model", here=None, **argument):
        """Raise :class:`LatencyModelMismatchError` unless ``graph`` is this architecture and
        ``here`` is the kind of device it was timed on.

        A latency model of another device kind is refused (a CPU's time goes
        into work per channel, a GPU's into per-layer launches: a plan for one
        is not one for the other); another chip of the same kind warns.

        Args:
            graph: the walked model it is used for.
            subject: how the message names this latency model, e.g.
                ``"{latency_model}"`` with ``latency_model="fit.json"``.
            here: the :class:`~keras_precrop.latency.timing.Device` it is used
                on; None skips the device check (a prediction for the device
                it was fitted on).
            **argument: the argument a ``{...}`` subject names, with its value.
        """
        found = signature(graph)
        if found != self.signature:
            raise LatencyModelMismatchError(
                f"{subject} was fitted on model {self.model_name!r} (layer signature "
                f"{self.signature}), not on model {graph.model.name!r} (signature {found}); "
                "fit one for this model with {remedy}.", remedy=_FIT_REMEDY, **argument)
        if here is None or self.device_kind is None:
            return
        message = (f"{subject} was timed on {self.device()}, and this process computes on "
                   f"{here.kind} {here.name!r}")
        if here.kind != self.device_kind:
            raise LatencyModelMismatchError(
                f"{message}: times do not carry over between kinds of device (a CPU's go into "
                "work per channel, a GPU's into per-layer launches); fit one here with "
                "{remedy}.", remedy=_FIT_REMEDY, **argument)
        if here.name != self.device_name:
            warnings.warn(str(LatencyModelMismatchError(
                f"{message}: its times may be off here; fit one here with {{remedy}}.",
                remedy=_FIT_REMEDY, **argument)), stacklevel=3)

    def device(self):
        """Where it was timed, in words (``gpu 'NVIDIA H200' (jax, runtime 'tf', batch 32,
        float32)``), or that this is unknown."""
        if self.device_kind is None:
            return "an unrecorded device (a custom timer, or a file from before devices were kept)"
        return (f"{self.device_kind} {self.device_name!r} ({self.backend}, runtime "
                f"{self.runtime!r}, batch {self.batch_size}, {self.precision})")

    def _features(self, graph):
        return Features.of(graph, self.columns)

    def cost_row(self, graph, subject="latency_model", **argument):
        """The predicted time as a :class:`~keras_precrop.budget.costs.CostRow` over ``graph``'s widths.

        What plans are made with, so it refuses another architecture and
        another kind of device than this one (:meth:`check`); ``subject`` and
        ``argument`` name this latency model in the error.
        """
        here = _timing.device_of(self.runtime) if self.device_kind is not None else None
        self.check(graph, subject, here, **argument)
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
        print_fn(f"Timed on {self.device()}")
        print_fn(f"Original: {self.seconds * 1e3:.3f} ms per batch (predicted), "
                 f"{self.variants[0]['seconds'] * 1e3:.3f} ms measured")
        print_fn(f"Held-out error: median {self.error['median']:.1%}, worst "
                 f"{self.error['worst']:.1%} ({sum(v['held_out'] for v in self.variants)} of "
                 f"{len(self.variants)} variants); fitted in {self.fit_seconds:.0f} s")
        if self.error.get("plans_median") is not None:
            print_fn(f"Error on the last refinement round's plans, before refitting: median "
                     f"{self.error['plans_median']:.1%}, worst {self.error['plans_worst']:.1%}")
        share = self._seconds_per_column()
        rows = [("Feature", "Coefficient (s/unit)", "Share of time")]
        for j in np.argsort(-share):
            if share[j] > 0:
                rows.append((self.columns[j], f"{self.coef[j]:.3e}",
                             f"{share[j] / share.sum():.1%}"))
        for line in _tables.table(rows):
            print_fn(line)

    def _seconds_per_column(self):
        """Each column's predicted seconds in the original model's time."""
        t = self.template
        return Features.from_template(self.columns, t).matrix(
            np.asarray(t["widths"]), np.asarray(t["fixed"]))[0] * self.coef

    def unreachable(self, err):
        """``err``, a plan's :class:`InfeasibleBudgetError`, with the latency floor said plainly.

        Where the latency budget is one that the narrowest widths exceed
        (``err.limit`` holds their predicted seconds), the message adds the
        smallest reachable latency ratio, the share of it that is this
        model's constant per layer call (launches and call overhead, which no
        channel count removes: small CNNs on a GPU are bound by it) and the
        remedies: a larger batch size spreads that constant over more
        examples, another runtime may launch less. Other errors come back as
        they are.
        """
        floor = err.limit.get(ROW) if isinstance(err.limit, dict) else None
        if floor is None:
            return err
        ratio = math.ceil(floor / self.seconds * 1e3) / 1e3  # rounded up: a budget that plans
        constant = sum(s for c, s in zip(self.columns, self._seconds_per_column()) if c == "const")
        bigger = 4 * self.batch_size
        return InfeasibleBudgetError(
            f"{err.template} The smallest reachable latency ratio is {ratio:g}: the narrowest "
            f"plan is predicted at {floor * 1e3:.4g} ms per batch of {self.batch_size}, the "
            f"original at {self.seconds * 1e3:.4g} ms, and {constant / floor:.0%} of the "
            "narrowest plan's time is a constant per layer call that no channel count removes "
            f"(launches and call overhead; timed on {self.device()}). Ask for a ratio of at "
            f"least {ratio:g}, or fit the latency model with a larger batch size or another "
            "runtime: {remedy}.", limit=err.limit, **err.arguments,
            remedy={"python": f"kp.latency_model(model, batch_size={bigger}), or another "
                              f"runtime= than {self.runtime!r}",
                    "cli": f"`keras-precrop latency MODEL --batch_size {bigger}`, or another "
                           f"--runtime than {self.runtime}"})

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
