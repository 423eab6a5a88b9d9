"""The fitted latency model: predicted seconds per batch of one model at any widths."""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
MIN_HELD_OUT = 3  # held-out variants an error is estimated from (fewer: not estimated)
FIT_REMEDY = {"python": "kp.latency_model(model)",
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


# What LatencyModel.summary's feature names mean, printed under its table.
_LEGEND = (
    "Features: macs:<class> = multiply-accumulates of that layer class; in:<class> / out:<class> = "
    "elements (pixels x channels) the class reads / writes; const = a fixed time per layer call "
    "(launches, call overhead), with the work of layers whose widths are all fixed; <feature>@<n> "
    "= the same with every prunable width rounded up to a multiple of n (kernels that work on "
    "blocks of n channels pay for a partly filled block). Counts are per example; coefficients "
    "are seconds per batch per unit.",
    "A share is time that scales with that feature across the timed widths, not a profile of "
    "the layer class: a feature of one width (a global pooling reads only the last width) also "
    "takes the time of other layers that scale with that width; features proportional at every "
    "width share a row (a = b), since no fit can split their time.",
)


@dataclasses.dataclass
class LatencyModel(_json.JsonDataclass):
    """A fitted latency model: predicted seconds per batch of one model at any widths.

    Attributes:
        model_name, signature, input_shape: identity of the model it was
            fitted on (the signature ignores widths, so it also fits that
            model's rebuilt copies).
        batch_size, runtime, training: what was timed; the runtime by its
            name in the process that fitted it (the Keras backend's own step
            is ``"tf"``, ``"jax"`` or ``"torch"``; files written before that
            say ``"tf"`` under every backend, and still load and plan).
        residual, ignore: width variables the variants varied.
        attention: what the attention layers' width variables count
            (``"heads"``, files written before the choice; or ``"head_dims"``).
        block: the features' rounded copies (columns ``<feature>@<block>``)
            round free widths up to multiples of this (1: no copies).
        ridge: the fit's ridge penalty (chosen by cross-validation).
        columns, coef: feature names (``macs:Conv2D``, ``out:ReLU``,
            ``const``, ``out:ReLU@16``, ...) and seconds per unit of each.
        error: relative prediction error on the held-out variants
            (``median``, ``worst``; None where fewer than
            :data:`MIN_HELD_OUT` were held out, too few to estimate it), on
            the fitted ones (``train_median``,
            ``train_worst``) and on the last refinement round's plans as
            the fit that made them predicted them, before they were timed
            (``plans_median``, ``plans_worst``; None without refinement);
            ``not_monotone``: the uniform variants timed more than 10% slower
            than a wider one (``narrower``, ``wider``, ``ratio``; empty where
            time fell with width, absent in files written before).
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
        round_to: the free widths of the variants (and of the refinement
            plans) were multiples of this (1: any width; files written before
            it was recorded say 1).
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
    round_to: int = 1
    attention: str = "heads"
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
                "precision": self.precision, "round_to": self.round_to,
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
            here: the :class:`~keras_precrop.latency.devices.Device` it is used
                on; None skips the device check (a prediction for the device
                it was fitted on).
            **argument: the argument a ``{...}`` subject names, with its value.
        """
        found = signature(graph)
        if graph.attention != self.attention:
            raise LatencyModelMismatchError(
                f"{subject} was fitted with attention={self.attention!r} (what its attention widths "
                f"count), not attention={graph.attention!r}; fit one with the plan's attention= "
                "with {remedy}.", remedy=FIT_REMEDY, **argument)
        if found != self.signature:
            raise LatencyModelMismatchError(
                f"{subject} was fitted on model {self.model_name!r} (layer signature "
                f"{self.signature}), not on model {graph.model.name!r} (signature {found}); "
                "fit one for this model with {remedy}.", remedy=FIT_REMEDY, **argument)
        if here is None or self.device_kind is None:
            return
        message = (f"{subject} was timed on {self.device()}, and this process computes on "
                   f"{here.kind} {here.name!r}")
        if here.kind != self.device_kind:
            raise LatencyModelMismatchError(
                f"{message}: times do not carry over between kinds of device (a CPU's go into "
                "work per channel, a GPU's into per-layer launches); fit one here with "
                "{remedy}.", remedy=FIT_REMEDY, **argument)
        if here.name != self.device_name:
            warnings.warn(str(LatencyModelMismatchError(
                f"{message}: its times may be off here; fit one here with {{remedy}}.",
                remedy=FIT_REMEDY, **argument)), stacklevel=3)

    def device(self):
        """Where it was timed, in words (``gpu 'NVIDIA H200' (jax, runtime 'jax', batch 32,
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
            graph = _graph.walk(x, ignore=self.ignore, residual=self.residual, attention=self.attention)
            self.check(graph, "predict's model")
            cm = _costs.CostModel(graph)  # heads and fixed widths are not rounded up to the block
            return float(self._evaluate(self._features(graph), cm.widths, cm.unrounded))
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

    def held_out_text(self):
        """The held-out error in words, or that too few variants were held out to estimate it."""
        held = sum(v["held_out"] for v in self.variants)
        if self.error.get("median") is None or held < MIN_HELD_OUT:
            cv = self.error.get("cross_validated_rms")
            return (f"held-out error not estimated ({held} of {len(self.variants)} variants held "
                    f"out; at least {MIN_HELD_OUT} are needed: raise variants= or holdout=)"
                    + (f"; leave-one-out RMS error on the fitted variants {cv:.1%}"
                       if cv is not None else ""))
        return (f"held-out error median {self.error['median']:.1%}, worst "
                f"{self.error['worst']:.1%} ({held} of {len(self.variants)} variants)")

    def summary(self, print_fn=print):
        """Print the fit: what was timed, its error, the share of time of each feature, and a
        legend of the feature names.

        Features that are proportional to each other at every width of this
        model (``in:ReLU`` and ``out:ReLU``; a global pooling's input and the
        dense layer it feeds; the per-call constant and work of layers whose
        widths are all fixed) cannot be told apart by any fit, which splits
        their time among them at will: they share one row.
        """
        what = "training step" if self.training else "inference"
        print_fn(f'Latency model of "{self.model_name}": {what}, runtime {self.runtime}, '
                 f"batch {self.batch_size}, block {self.block}")
        print_fn(f"Timed on {self.device()}")
        print_fn(f"Original: {self.seconds * 1e3:.3f} ms per batch (predicted), "
                 f"{self.variants[0]['seconds'] * 1e3:.3f} ms measured")
        text = self.held_out_text()
        print_fn(f"{text[0].upper()}{text[1:]}; fitted in {self.fit_seconds:.0f} s")
        if self.error.get("plans_median") is not None:
            print_fn(f"Error on the last refinement round's plans, before refitting: median "
                     f"{self.error['plans_median']:.1%}, worst {self.error['plans_worst']:.1%}")
        for p in self.error.get("not_monotone") or ():
            print_fn(f"Not monotone: {p['narrower']} timed {p['ratio']:.2f}x {p['wider']}'s time")
        share = self._seconds_per_column()
        rows = [("Feature", "Coefficient (s/unit)", "Share of time")]
        for group in sorted(self._proportional_groups(), key=lambda g: -share[g].sum()):
            if share[group].sum() > 0:
                coef = f"{self.coef[group[0]]:.3e}" if len(group) == 1 else "(together)"
                rows.append((" = ".join(self.columns[j] for j in group), coef,
                             f"{share[group].sum() / share.sum():.1%}"))
        for line in _tables.table(rows):
            print_fn(line)
        for line in _LEGEND:
            print_fn(line)

    def _proportional_groups(self):
        """Column indices in groups of columns proportional to each other at every width
        (found at the original widths and 7 random scalings of them), ``const`` first."""
        t = self.template
        widths, fixed = np.asarray(t["widths"], dtype=np.float64), np.asarray(t["fixed"])
        rng = np.random.default_rng(0)
        scaled = np.where(fixed, widths, np.maximum(1, np.round(
            widths * rng.uniform(0.25, 1.0, (7, len(widths))))))
        m = Features.from_template(self.columns, t).matrix(np.vstack([widths, scaled]), fixed)
        groups = {}
        for j in sorted(range(len(self.columns)), key=lambda j: self.columns[j] != "const"):
            key = tuple(np.round(m[:, j] / m[0, j], 9)) if m[0, j] else ("zero", j)
            groups.setdefault(key, []).append(j)
        return [np.array(g) for g in groups.values()]

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
        grid = (f" Its widths are multiples of round_to={self.round_to}, which keeps narrow "
                "layers wider than the runtime could run them." if self.round_to > 1 else "")
        return InfeasibleBudgetError(
            f"{err.template} The smallest reachable latency ratio is {ratio:g}: the narrowest "
            f"plan is predicted at {floor * 1e3:.4g} ms per batch of {self.batch_size}, the "
            f"original at {self.seconds * 1e3:.4g} ms, and {constant / floor:.0%} of the "
            "narrowest plan's time is a constant per layer call that no channel count removes "
            f"(launches and call overhead; timed on {self.device()}).{grid} Ask for a ratio of at "
            f"least {ratio:g}, or fit the latency model with a larger batch size or another "
            "runtime: {remedy}.", limit=err.limit, **err.arguments,
            remedy={"python": f"kp.latency_model(model, batch_size={bigger}), or another "
                              f"runtime= than {self.runtime!r}",
                    "cli": f"`keras-precrop latency MODEL --batch_size {bigger} --json "
                           f"latency.json` (or another --runtime than {self.runtime}), then "
                           "--latency_model latency.json"})

    @classmethod
    def from_json(cls, text_or_path):
        """A latency model from JSON text or a ``.json`` file (:meth:`to_json`'s).

        Raises:
            UnusableLatencyModel: the file cannot be read, is cut off or not
                JSON, holds something else (a plan) or a latency model that
                cannot predict (coefficients that are not finite, negative or
                all zero, a template that does not fit its columns); the
                message names the file and what is wrong.
        """
        text, source = str(text_or_path), "the JSON text"
        if not text.lstrip().startswith("{"):
            source = f"file {text!r}"
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except OSError as err:
                raise UnusableLatencyModel(source, f"cannot be read ({err.strerror})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            cut = err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string")
            reason = ("is cut off: its JSON ends in the middle (was it written completely?)" if cut
                      else f"is not JSON ({err.msg} at line {err.lineno}, column {err.colno})")
            raise UnusableLatencyModel(source, reason) from None
        try:
            return cls.from_dict(data)
        except UnusableLatencyModel as err:
            raise UnusableLatencyModel(source, err.reason) from None

    @classmethod
    def from_dict(cls, data):
        """A latency model from :meth:`to_dict`'s data (format 1 files too).

        Format 1 rounded every feature to ``block``; its columns are renamed
        ``<feature>@<block>``, which predicts the same. Data that is no
        latency model, or one that cannot predict, raises
        :class:`UnusableLatencyModel`.
        """
        reason = _not_a_latency_model(data)
        if reason:
            raise UnusableLatencyModel("the data", reason)
        version = data.get("format", _FORMAT)
        if version == 1:
            suffix = f"@{data['block']}" if data["block"] > 1 else ""
            data = {**data, "columns": [c + suffix for c in data["columns"]], "format": _FORMAT}
        elif version != _FORMAT:
            raise UnusableLatencyModel("the data", f"is of latency model format {version!r}, "
                                                   f"which this version does not read ({_FORMAT})")
        reason = _cannot_predict(data)
        if reason:
            raise UnusableLatencyModel("the data", reason)
        return super().from_dict(data)


class UnusableLatencyModel(ValueError):
    """A latency model file or text that is none, or cannot predict.

    Attributes:
        source: what was read (``file 'lm.json'``).
        reason: what is wrong, as a predicate of it (``is cut off: ...``).
    """

    def __init__(self, source, reason):
        super().__init__(f"{source} {reason}")
        self.source, self.reason = source, reason


_PLAN_FIELDS = {"variables", "layers", "budgets"}  # a plan's (kp.Plan.to_json), not a latency model's


def _not_a_latency_model(data):
    """What makes ``data`` (parsed JSON) something other than a latency model, or None."""
    if not isinstance(data, dict):
        return f"is not a latency model: it holds a JSON {type(data).__name__}, not an object"
    if _PLAN_FIELDS <= set(data) and "coef" not in data:
        return ("is a plan (what kp.plan and `keras-precrop precrop --plan` write), not a latency "
                "model (what kp.latency_model and `keras-precrop latency --json` write)")
    fields = dataclasses.fields(LatencyModel)
    missing = sorted(f.name for f in fields if f.default is dataclasses.MISSING
                     and f.name not in data)
    if missing:
        return f"is not a latency model: it lacks the fields {missing}"
    return None


def _cannot_predict(data):
    """Why the latency model ``data`` (format 2) cannot predict a time, or None."""
    columns, t = data["columns"], data["template"]
    try:
        coef = np.asarray(data["coef"], dtype=np.float64)
        terms = [np.asarray(t[k], dtype=np.float64) for k in ("col", "mult", "a", "b")]
        widths = np.asarray(t["widths"], dtype=np.float64)
    except (TypeError, ValueError, KeyError) as err:
        return f"holds a coefficient or template entry that is not a number ({err})"
    if coef.shape != (len(columns),):
        return f"holds {coef.size} coefficients for {len(columns)} feature columns"
    bad = [f"{c!r}: {v:.3g}" for c, v in zip(columns, coef) if not np.isfinite(v) or v < 0]
    if bad:
        return (f"holds coefficients that are not finite non-negative seconds ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}); a fitted time is never negative or NaN")
    if not coef.any():
        return "predicts no time at all: every coefficient is zero"
    col, mult, a, b = terms
    if len({len(x) for x in terms}) != 1 or not len(widths) == len(t.get("names", ())) \
            == len(t.get("fixed", ())) \
            or not np.all(np.isfinite(mult)) or not np.all(np.isfinite(widths)) \
            or (len(col) and (col.min() < 0 or col.max() >= len(columns) or min(a.min(), b.min()) < 0
                              or max(a.max(), b.max()) > len(widths))):
        return "holds a template that does not fit its feature columns and width variables"
    return None
