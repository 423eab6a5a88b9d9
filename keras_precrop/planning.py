"""The planning floor: budgets in, a :class:`Plan` out, and back to a model.

A :class:`Plan` is the bridge between solving and rebuilding: it records the
width chosen for every width variable (a channel group or a residual view;
see ``graph/channels.py`` for the vocabulary), the per-layer costs and
densities it implies, and how the budgets were met. Plans are plain JSON, so
a plan computed once (on a laptop, say) can be applied later to a model built
inside a TPU or GPU strategy scope with :func:`apply_plan`.

This module only orchestrates the wings below it: it turns the user's
arguments into budgets by row name (``params``, ``macs``, ``latency``),
profiles the model (graph wing), fits or reads a latency model (latency
wing), solves (``budget.modes.solve``, where the translation modes live) and
rebuilds (``graph.rebuild``), checking the result (``verify``); with
``weights="keep"`` the transfer wing carries the trained weights over.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import os
import random
import re

import keras
import numpy as np

from keras_precrop import _json, _tables
from keras_precrop import latency as _latency
from keras_precrop import transfer as _transfer
from keras_precrop import verify as _verify
from keras_precrop.budget import costs as _costs
from keras_precrop.budget.modes import FLOOR_ON, MODES, solve
from keras_precrop.errors import (
    ArgumentError,
    ArgumentTypeError,
    PlanMismatchError,
    RebuildMismatchError,
    UnsupportedModelError,
)
from keras_precrop.graph.rebuild import check_seed, layer_from_config, random_layers, rebuild
from keras_precrop.graph.trace import input_specs, is_functional
from keras_precrop.graph.walker import ignore_names, walk
from keras_precrop.training._user_data import check_data, outputs_probabilities

__all__ = ["Plan", "PlanMismatchError", "RebuildMismatchError", "apply_plan", "plan", "precrop",
           "reconfigure"]

_OLD_KEYS = {"groups": "variables"}  # JSON keys of older plans -> Plan fields
# The spatial size that stands in for an input's undefined one where only parameters count.
_PROBE_SIZE = 224


@dataclasses.dataclass
class Plan(_json.JsonDataclass):
    """Channel widths for a model, with the costs they imply.

    Attributes:
        model_name: name of the model the plan was made for.
        mode: ``"exact"``, ``"layerwise"``, ``"paper"`` or ``"uniform"`` (what ``"auto"``
            chose, with the reason in ``solver["auto_mode"]``).
        residual: residual semantics used (``"prefix"`` or ``"tie"``).
        ignore: layer names whose channels were kept fixed.
        variables: per width variable: name, kind, original and new width,
            fixed (older plans call this key ``"groups"``; they load too).
        layers: per layer: name, class, input and output channels, params/MACs
            before and after, density.
        original: ``{"params", "macs"}`` of the original model.
        predicted: ``{"params", "macs"}`` of the rebuilt model (exact integers).
        budgets: absolute ``{"params", "macs"}`` targets (``None`` if unset).
        solver: diagnostics (objective, continuous optimum, deviation, ...).
        input_shapes: the shape of each of the model's inputs without the batch
            axis, as the model was built (``None`` for an open size); a plan
            applies to a model of these shapes. ``None`` in plans written
            before it was recorded (they load too, unchecked).

    With a latency model, ``original``, ``predicted`` and ``budgets`` also
    hold ``"latency"`` (seconds per batch, as the latency model predicts) and
    ``solver["latency_model"]`` says what was timed.
    """

    model_name: str
    mode: str
    residual: str
    ignore: list
    variables: list
    layers: list
    original: dict
    predicted: dict
    budgets: dict
    solver: dict
    input_shapes: list = None

    @property
    def params(self):
        """Parameters of the rebuilt model (== ``profile(new).total_params``)."""
        return self.predicted["params"]

    @property
    def macs(self):
        """MACs per example of the rebuilt model."""
        return self.predicted["macs"]

    @property
    def latency(self):
        """Predicted seconds per batch of the rebuilt model (None without a latency model)."""
        return self.predicted.get("latency")

    @property
    def widths(self):
        """``{variable name: new width}``."""
        return {v["name"]: v["new"] for v in self.variables}

    @property
    def mode_label(self):
        """The mode, with the floor that bounded it (``"exact, floor=1.0"``, ``"exact, floor=1.0 on
        streams"``): how tables name the plan."""
        if "floor" not in self.solver:
            return self.mode
        held = " on streams" if self.solver.get("floor_on") == "streams" else ""
        return f"{self.mode}, floor={float(self.solver['floor'])!r}{held}"

    @classmethod
    def from_dict(cls, data):
        """A plan from :meth:`to_dict`'s data (older plans' keys included)."""
        return super().from_dict({_OLD_KEYS.get(k, k): v for k, v in data.items()})

    def summary(self, print_fn=print, only_changed=False, show_all_hint="only_changed=False"):
        """Print a before/after table of layers, then totals vs. budgets.

        Each layer shows its input and output channels, parameters and MACs,
        as ``before -> after`` where they change. Layers without parameters
        or MACs (activations, adds, pooling) are left out. With a latency
        model, the totals include the predicted time.

        Args:
            print_fn: where each line goes.
            only_changed: leave out layers whose parameters did not change;
                a note under the table says how many were left out.
            show_all_hint: how the caller shows every layer, for that note
                (the command line passes its ``--all`` flag).
        """
        rows = [("Layer (type)", "In channels", "Out channels", "Params", "MACs", "Density")]
        hidden = 0
        for layer in self.layers:
            if not (layer["params"] or layer["macs"]):
                continue
            if only_changed and layer["params_new"] == layer["params"]:
                hidden += 1
                continue
            rows.append((
                f"{layer['name']} ({layer['class_name']})",
                # Plans written before input channels were recorded lack them.
                _change(layer.get("channels_in", "?"), layer.get("channels_in_new", "?")),
                _change(layer["channels"], layer["channels_new"]),
                _change(f"{layer['params']:,}", f"{layer['params_new']:,}"),
                _change(f"{layer['macs']:,}", f"{layer['macs_new']:,}"),
                "" if layer["density"] is None else f"{layer['density']:.3f}",
            ))
        auto = ', picked by mode="auto"' if "auto_mode" in self.solver else ""
        print_fn(f'Plan ({self.mode_label}{auto}, residual={self.residual}): "{self.model_name}"')
        for line in _tables.table(rows) + _tables.not_shown(hidden, "unchanged layer{s}", show_all_hint):
            print_fn(line)
        totals = [("params", "Params", "{:,.0f}"), ("macs", "MACs", "{:,.0f}")]
        if "latency" in self.predicted:
            timed = self.solver["latency_model"]
            what = "training step" if timed["training"] else "inference"
            totals.append(("latency", f"Latency ({what}, {timed['runtime']}, batch "
                           f"{timed['batch_size']}, predicted; ms)", "{:,.3f}"))
        for key, label, fmt in totals:
            scale = 1e3 if key == "latency" else 1
            before, after = self.original[key], self.predicted[key]
            budget = self.budgets.get(key)
            text = (f"{label}: {fmt.format(before * scale)} -> {fmt.format(after * scale)} "
                    f"({after / before:.1%})")
            if budget is not None:
                text += f"   budget {fmt.format(budget * scale)} ({budget / before:.1%})"
            print_fn(text)
        calibration = self.solver.get("latency_calibration")
        if calibration:
            print_fn(f"Latency measured: {calibration['measured']:.1%} of the original's time "
                     f"(target {calibration['target']:.1%}, {len(calibration['rounds'])} "
                     f"round{'s' * (len(calibration['rounds']) > 1)}"
                     f"{'' if calibration['met'] else '; NOT met'})")


def _change(before, after):
    """A table cell: ``before -> after``, or one value if it did not change."""
    return before if before == after else f"{before} -> {after}"


# The budget arguments by cost row: (ratio keyword, what the ratio is of, absolute keyword,
# its unit). Latency has only a ratio, of the time the latency model predicts for the original.
_BUDGET_ARGS = {"params": ("params", "parameters", "max_params", "parameters"),
                "macs": ("flops", "FLOPs", "max_macs", "MACs"),
                _latency.ROW: ("latency", "predicted time", None, None)}


def _resolve_budget(row, ratio, absolute, original, can_grow):
    """The budget of cost row ``row`` from a ratio of the original or an absolute value.

    Args:
        row: ``"params"``, ``"macs"`` or ``"latency"`` (which has no absolute form).
        ratio: the ratio argument (``params`` / ``flops`` / ``latency``) or None.
        absolute: the absolute argument (``max_params`` / ``max_macs``) or None.
        original: the original model's parameters / MACs (1.0 for latency,
            whose original time is known only once a latency model is fitted).
        can_grow: whether widths may exceed the original (PreConfig); if
            not, a budget above the original is refused, since it would
            silently return the model unchanged.

    Returns:
        ``(budget, (argument name, value))``, the budget as params and MACs
        in float integers, latency as the ratio times ``original``; or
        ``None`` when neither argument is given.

    Raises:
        ArgumentError, ArgumentTypeError: naming the argument as the user
            passed it (``flops=0``), which the command line shows as its flag.
    """
    ratio_name, ratio_unit, absolute_name, absolute_unit = _BUDGET_ARGS[row]
    if ratio is not None and absolute is not None:
        raise ArgumentError(f"Give either {{{ratio_name}}} (a ratio) or {{{absolute_name}}} (an "
                            "absolute count), not both.",
                            **{ratio_name: ratio, absolute_name: absolute})
    if ratio is None and absolute is None:
        return None
    is_ratio = ratio is not None
    name, value = (ratio_name, ratio) if is_ratio else (absolute_name, absolute)
    what = (f"ratio of the original model's {ratio_unit} (e.g. 0.5)" if is_ratio
            else f"number of {absolute_unit}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ArgumentTypeError(f"{{{name}}} must be a {what}.", **{name: value})
    if not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"{{{name}}} must be a positive, finite {what}.", **{name: value})
    if not can_grow and (value > 1 if is_ratio else value > original):
        size = (f"{value:.0%} of the original model's {ratio_unit}" if is_ratio
                else f"more than the original model's {original:,} {absolute_unit}")
        raise ArgumentError(
            f"{{{name}}} asks for {size}, but PreCrop only removes channels: the model would "
            "come back unchanged. Use reconfigure (PreConfig) to let layers grow.",
            limit=1.0 if is_ratio else original, **{name: value})
    budget = float(value) * original if is_ratio else float(value)
    if row != "latency":  # params and MACs are integers: round away float noise
        budget = float(math.floor(budget * (1 + 1e-12)))
    return budget, (name, value)


def plan(model, params=None, flops=None, *, max_params=None, max_macs=None,
         mode="auto", upper=1.0, round_to=1, min_channels=1, ignore=(),
         residual="prefix", latency=None, latency_model=None, balance=None, floor=None,
         floor_on=None, calibrate=None):
    """Choose new channel widths for ``model`` under parameter/FLOP budgets.

    Args:
        model: a functional or Sequential Keras model with a defined input shape
            (or a :class:`Subject` of one, whose walk it reuses).
        params: parameter budget as a ratio of the model's parameters.
        flops: FLOP (= MAC) budget as a ratio of the model's MACs.
        max_params: absolute parameter budget (instead of ``params``).
        max_macs: absolute MAC budget (instead of ``flops``).
        mode: ``"exact"`` (width program, integer repair), ``"layerwise"``
            (the paper's densities and sqrt rule, calibrated to the budgets),
            ``"paper"`` (the paper's rule as published, budgets not
            enforced; the deviation is in ``plan.solver``), ``"uniform"``
            (one width factor for every layer, ``plan.solver["uniform_ratio"]``:
            the width-multiplier baseline) or ``"auto"``:
            the one :func:`auto_mode` picks for these budgets (``plan.mode``
            says which, ``plan.solver["auto_mode"]`` why).
        upper: cap on each width ratio: 1.0 prunes only (PreCrop); ``None``
            lets widths grow (PreConfig).
        round_to: widths are multiples of this (e.g. 8 for accelerators).
        min_channels: no width variable is narrower than this.
        ignore: layer names whose channels stay fixed (one string is one name).
        residual: ``"prefix"`` (PreCrop residual rule) or ``"tie"``.
        latency: time budget as a ratio of the original model's time as
            ``latency_model`` predicts it (e.g. 0.5).
        latency_model: a :class:`~keras_precrop.latency.LatencyModel` fitted
            on this model (or a path to its JSON, or a dict of
            :func:`~keras_precrop.latency_model` options); None with
            ``latency`` set measures one now (about a minute). Given without
            ``latency``, the plan only reports the predicted time.
        balance: exact mode only (``"auto"`` picks it): a factor >= 1 by
            which the width ratios (new / original) of adjacent widths may
            differ at most: a kernel's input and output, a residual view
            and its stream. The SynExp objective alone can put a 3-channel
            layer between two 50-channel ones; ``balance=2`` forbids such
            bottlenecks (integer rounding may exceed it slightly;
            ``plan.solver["balance_max"]`` reports the largest factor of
            every plan).
        floor: exact mode only (``"auto"`` picks it): a ratio in (0, 1]; no
            free width is narrower than ``floor`` times the width
            ``mode="uniform"`` gives at the same budgets (rounded down onto
            the grid), and the width program spends what the budgets leave.
            ``floor=1.0`` keeps the width multiplier's model as the narrowest
            allowed: under a latency budget, exact mode alone narrows
            residual streams to a few channels, which the latency model
            underprices (``plan.solver["floor_ratio"]`` is the factor).
        floor_on: which widths ``floor`` holds: ``"all"`` (None: the default),
            or ``"streams"``, the residual streams alone (the channels every
            block of a stage reads and adds to); the width program may then
            narrow the layers inside the blocks below the uniform widths.
        calibrate: rounds of measured feedback for a ``latency`` budget. A
            latency model's prediction of its own plan can be off (its
            features cannot express every kernel's cost), so each round
            rebuilds the plan, times it against the original (interleaved,
            as the latency model was timed) and, unless the measured time
            ratio is within 3% of ``latency``, solves again with the latency
            budget scaled by ``latency / measured``. The plan that meets
            ``latency`` closest from below is kept (else the fastest), and
            ``plan.solver["latency_calibration"]`` lists the rounds. None:
            2 when the latency model is measured in this call (on this
            machine, with its ``timer``), else 0: a latency model loaded
            from a file may describe another device.

    Returns:
        A :class:`Plan`.

    Raises:
        ValueError: for a budget that is not a positive finite number, both
            forms of one budget, no budget, or (with ``upper <= 1``, i.e.
            PreCrop) a budget above the original model, which could only
            return the model unchanged; the message names the argument as
            passed (``params=1.5``).
        TypeError: for a budget that is not a number.
        InfeasibleBudgetError: for a budget below the smallest allowed model.
    """
    can_grow = _check_options(mode, round_to, min_channels, upper, balance, floor, floor_on)
    ignore = ignore_names(ignore)  # ignore="stem" is one layer
    # Checked before profiling and timing, so a bad latency= fails at once.
    latency_budget = _resolve_budget(_latency.ROW, latency, None, 1.0, can_grow)
    measured_here = latency_model is None or isinstance(latency_model, dict)
    calibrate = _check_calibrate(calibrate, latency_budget is not None and measured_here,
                                 latency_budget is not None)
    subject = Subject.of(model)
    model, macs_arguments = subject.model, {"flops": flops, "max_macs": max_macs,
                                            "latency": latency, "latency_model": latency_model}
    measured = subject.defined(macs_arguments)
    prof = subject.profile(ignore, residual, macs_arguments)
    _costs.refuse_unknown_costs(prof, {"flops": flops, "max_macs": max_macs, "latency": latency})
    given = {row: _resolve_budget(row, ratio, absolute, original, can_grow)
             for row, ratio, absolute, original in (
                 ("params", params, max_params, prof.total_params),
                 ("macs", flops, max_macs, prof.total_macs))}
    if latency_budget is None and all(b is None for b in given.values()):
        raise ArgumentError("Give at least one budget: {params:=}, {flops:=}, {latency:=}, "
                            "{max_params:=} or {max_macs:=}.")
    cm, timed, lm = prof.cost, {}, None
    if latency_budget is not None or latency_model is not None:
        lm = _latency.resolve(latency_model, model, residual=residual, ignore=tuple(ignore))
        named = ({"subject": "{latency_model}", "latency_model": os.fspath(latency_model)}
                 if isinstance(latency_model, (str, os.PathLike)) else {})
        cm = cm.with_rows([lm.cost_row(prof.graph, **named)])
        timed = {"latency_model": lm.describe()}
        if latency_budget is not None:
            original = cm.totals(cm.widths)[cm.row_names.index(_latency.ROW)]
            given[_latency.ROW] = (latency_budget[0] * original, latency_budget[1])
    given = {row: b for row, b in given.items() if b is not None}
    budgets = {row: value for row, (value, _) in given.items()}
    arguments = {row: argument for row, (_, argument) in given.items()}

    def solve_for(b):
        with _latency.floor_said(lm):  # a latency budget below it names it, with remedies
            return solve(prof, cm, b, mode=mode, upper=upper, round_to=round_to,
                         min_channels=min_channels, balance=balance, floor=floor,
                         floor_on=floor_on, arguments=arguments)

    if calibrate:
        options = latency_model if isinstance(latency_model, dict) else {}
        ratio = _latency.time_ratio(lm, model, verbose=options.get("verbose", 1),
                                    timer=options.get("timer"))
        chosen = {}

        def solve_widths(b):
            widths, info, chosen["mode"] = solve_for(b)
            return widths, info

        widths, info = _latency.calibrated(
            solve_widths, lambda w: ratio(rebuild(prof.graph, w.astype(int))),
            lambda w: cm.totals(w)[cm.row_names.index(_latency.ROW)], budgets, latency, calibrate)
        mode = chosen["mode"]
    else:
        widths, info, mode = solve_for(budgets)
    if measured is not model:
        info["spatial_probe"] = list(measured.inputs[0].shape[1:])
    return _make_plan(prof, cm, widths, budgets, mode, residual, list(ignore), {**info, **timed},
                      [list(shape[1:]) for _, shape in input_specs(model)])


class Subject:
    """The user's model as one call of the package sees it: walked once, the walk handed down.

    :func:`precrop` plans and applies with one walk of the model (the
    rebuild, its check and the copy of weights read that walk; only the
    rebuilt model is walked once more), and :func:`compare` plans every mode
    with it. A subject lives for one call: nothing in the package keeps a
    model, its trace or its walk afterwards, so dropping the results frees
    the model. :func:`plan` and :func:`apply_plan` take one in place of the
    model.

    Attributes:
        model: the user's model.
    """

    def __init__(self, model):
        self.model = model
        self._defined = None  # the copy at a defined spatial size, once made
        self._profile = None  # ((ignore, residual), the profile of the one walk)

    @classmethod
    def of(cls, model):
        """``model`` if it is a subject already, else a new subject of it."""
        return model if isinstance(model, cls) else cls(model)

    def defined(self, macs_arguments):
        """The model, or a copy whose undefined spatial sizes are :data:`_PROBE_SIZE` (made once).

        Parameters do not depend on the spatial size, so a model built as
        ``keras.Input((None, None, 3))`` can be planned under parameter budgets
        on a copy with a defined size (its MACs are then those at that size).
        Budgets that count MACs or time need the model's own size.

        Args:
            macs_arguments: ``{name: value}`` of the arguments that need MACs or
                timing (``flops``, ``latency``, ...); those given are refused.
        """
        specs = _probe_specs(self.model, macs_arguments)
        if specs is None:
            return self.model
        if self._defined is None:
            self._defined = _with_inputs(self.model, specs)
        return self._defined

    def profile(self, ignore, residual, macs_arguments):
        """The profile of the walk of :meth:`defined` (``profile.graph``), walked once per
        ``ignore`` and ``residual``."""
        defined, key = self.defined(macs_arguments), (frozenset(ignore), residual)
        if self._profile is None or self._profile[0] != key:
            self._profile = key, _costs.ModelProfile(walk(defined, ignore=ignore, residual=residual))
        return self._profile[1]


def _probe_specs(model, macs_arguments):
    """``None`` for a model whose spatial sizes are defined, else its inputs at :data:`_PROBE_SIZE`.

    Raises:
        ArgumentError: for an undefined size under arguments that need MACs or time
            (see :meth:`Subject.defined`).
    """
    specs = input_specs(model)  # an unsupported model gets the walker's error here
    shapes = [shape for _, shape in specs]
    if all(None not in shape[1:] for shape in shapes):
        return None
    given = {k: v for k, v in macs_arguments.items() if v is not None}
    if given:
        raise ArgumentError(
            f"{' and '.join('{' + k + '}' for k in given)} need{'s' * (len(given) == 1)} MACs or "
            f"time, which depend on the spatial size, but model {model.name!r} has the undefined input shape "
            f"{shapes[0]}; build it with a full input shape, e.g. keras.Input((224, 224, 3)), "
            "or give a parameter budget alone.", **given)
    if not is_functional(model):  # a copy at the probe size needs a functional graph
        raise UnsupportedModelError(
            f"Subclassed model {model.name!r} has the undefined input shape "
            f"{shapes[0]}; build it with a full input shape, e.g. keras.Input((224, 224, 3)) "
            "or model.build((None, 224, 224, 3)).")
    return [(name, shape[:1] + tuple(_PROBE_SIZE if d is None else d for d in shape[1:]))
            for name, shape in specs]


def _with_inputs(model, specs):
    """A fresh copy of functional ``model`` on inputs of other spatial sizes (and its inputs' dtypes)."""
    inputs = [keras.Input(shape[1:], name=name, dtype=tensor.dtype)
              for (name, shape), tensor in zip(specs, model.inputs, strict=True)]
    return keras.models.clone_model(model, input_tensors=inputs if len(inputs) > 1 else inputs[0],
                                    clone_function=lambda op: layer_from_config(op, op.get_config()))


def _check_options(mode, round_to, min_channels, upper, balance, floor, floor_on):
    """Checks :func:`plan`'s width options; returns whether widths may grow."""
    if mode not in MODES and mode != "auto":
        raise ArgumentError(f"{{mode}} is unknown; use one of {sorted(MODES) + ['auto']}.",
                            mode=mode)
    for name, value in (("round_to", round_to), ("min_channels", min_channels)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ArgumentError(f"{{{name}}} must be a positive integer.", **{name: value})
    if upper is not None and (isinstance(upper, bool) or not isinstance(upper, (int, float, np.number))
                              or not math.isfinite(upper) or upper <= 0):
        raise ArgumentError("{upper} must be a positive ratio or None.", upper=upper)
    if balance is not None:
        if isinstance(balance, bool) or not isinstance(balance, (int, float, np.number)) \
                or not math.isfinite(balance) or balance < 1:
            raise ArgumentError("{balance} must be a factor >= 1 (e.g. 2) or None.",
                                balance=balance)
    for name, value in (("balance", balance), ("floor", floor)):
        if value is not None and mode not in ("exact", "auto"):
            raise ArgumentError(f"{{{name}}} needs {{mode:exact}} (the width program); {{mode}} "
                                "sets widths by its own rule.", **{name: value}, mode=mode)
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float, np.number))
                              or not 0 < floor <= 1):
        raise ArgumentError("{floor} must be a ratio in (0, 1] of the uniform widths (e.g. 1.0) "
                            "or None.", floor=floor)
    if floor_on is not None and floor_on not in FLOOR_ON:
        raise ArgumentError(f"{{floor_on}} is unknown; use one of {list(FLOOR_ON)}.", floor_on=floor_on)
    if floor_on is not None and floor is None:
        raise ArgumentError("{floor_on} says which widths a floor holds; give {floor:=} too.",
                            floor_on=floor_on)
    return upper is None or upper > 1


def _check_calibrate(calibrate, measured_here, has_latency):
    """The rounds of calibration: ``calibrate``, or its default (2 when timed here, else 0)."""
    if calibrate is None:
        return 2 if measured_here else 0
    if isinstance(calibrate, bool) or not isinstance(calibrate, (int, np.integer)) or calibrate < 0:
        raise ArgumentError("{calibrate} must be a number of rounds >= 0.", calibrate=calibrate)
    if calibrate and not has_latency:
        raise ArgumentError("{calibrate} calibrates a latency budget; give {latency:=} too.",
                            calibrate=calibrate)
    return calibrate


def _make_plan(prof, cm, widths, budgets, mode, residual, ignore, info, input_shapes):
    """The :class:`Plan` record of ``widths``: per-variable and per-layer before/after."""
    widths = np.asarray(widths, dtype=np.float64)
    before = cm.per_layer(cm.widths)
    after = cm.per_layer(widths)
    density = cm.layer_densities(widths)
    has_kernel = set(cm.obj_layer.tolist())
    names = {v.name: i for i, v in enumerate(cm.variables)}

    def channels(variables, scales, w):
        return "/".join(str(int(w[names[v]]) * k) for v, k in zip(variables, scales)) or "-"

    layers = []
    for i, layer in enumerate(prof.layers):
        outs, ins = (layer.out_variables, layer.out_scales), (layer.in_variables, layer.in_scales)
        layers.append({
            "name": layer.name, "class_name": layer.class_name,
            "channels": channels(*outs, cm.widths),
            "channels_new": channels(*outs, widths),
            "channels_in": channels(*ins, cm.widths),
            "channels_in_new": channels(*ins, widths),
            "params": int(round(before[i, 0])), "params_new": int(round(after[i, 0])),
            "macs": int(round(before[i, 1])), "macs_new": int(round(after[i, 1])),
            "density": float(density[i]) if i in has_kernel else None,
        })
    total = cm.totals(widths)
    info = dict(info, objective=float(cm.objective(widths)))
    extra = cm.row_names[2:]  # e.g. latency: seconds, not counts
    return Plan(
        model_name=prof.model_name, mode=mode, residual=residual, ignore=ignore,
        variables=[{"name": v.name, "kind": v.kind, "width": int(v.width),
                    "new": int(widths[i]), "fixed": bool(v.fixed)}
                   for i, v in enumerate(cm.variables)],
        layers=layers,
        original={"params": prof.total_params, "macs": prof.total_macs,
                  **dict(zip(extra, map(float, cm.totals(cm.widths)[2:])))},
        predicted={"params": int(round(total[0])), "macs": int(round(total[1])),
                   **dict(zip(extra, map(float, total[2:])))},
        budgets={row: budgets.get(row) for row in cm.row_names},
        solver=info, input_shapes=input_shapes,
    )


def apply_plan(model, plan, weights=None, importance=None, data=None, seed=None):
    """Build a copy of ``model`` with the plan's widths: freshly initialized, or with its weights.

    Call it inside ``strategy.scope()`` to create the pruned model's variables
    there. The model must be the architecture the plan was made for (same
    layer names and original widths); otherwise :class:`PlanMismatchError`.
    The rebuilt model is walked afresh and checked against the plan (each
    layer's parameters, MACs and output width, and the totals); a model that
    disagrees is never returned: :class:`RebuildMismatchError` names the
    first layer that differs.

    Args:
        model: the model the plan was made for (trained, for ``weights="keep"``),
            or a :class:`Subject` of it, whose walk it reuses.
        plan: a :class:`Plan`, or the path (``str`` or ``os.PathLike``) of a
            plan file (:meth:`Plan.to_json`'s).
        weights: ``None``: fresh weights, as PreCrop prescribes. ``"keep"``:
            every width variable keeps its most important channels, with
            their trained weights (kernels, biases, normalization scales and
            statistics); residual streams are permuted so their best
            channels come first. Channels a layer gains (PreConfig) start
            from the initializer and the weights that read them at zero, so
            the widened model computes what ``model`` does.
        importance: how channels are ranked with ``weights="keep"``:
            ``"l1"`` (default: the L1 norm of the weights that produce and
            consume a channel, each layer's share normalized), ``"l2"``,
            ``"taylor"`` (``|activation x gradient|`` on ``data``) or
            ``"random"`` (seeded by ``seed``).
        data: for ``importance="taylor"``: an ``(x, y)`` batch or an
            iterable of them (integer labels or one-hot; the model's outputs
            are taken as logits, or as probabilities where it ends in a softmax).
        seed: ``None`` (default): the fresh weights and ``importance="random"``
            draw from Keras' global random state (``keras.utils.set_random_seed``
            fixes it). An integer >= 0 fixes both (each layer's initializers and
            random layers get seeds derived from it and the layer's position)
            and leaves the global state untouched: the same seed gives the same
            model. Refused (``ArgumentError``) where it would seed nothing:
            kept weights ranked by ``"l1"``, ``"l2"`` or ``"taylor"``, with no
            channel gained and no random layer (``Dropout``, noise).
    """
    importance = _transfer.check_options(weights, importance, data)
    plan = _plan_argument(plan)
    subject = Subject.of(model)
    model = subject.model
    _check_input_shapes(plan, model)
    if importance == "taylor":  # the data fits the model, before any work on it
        data = check_data(model, data, "data").data
    defined = subject.defined({})
    if importance and defined is not model:
        defined.set_weights(model.get_weights())
    graph = subject.profile(plan.ignore, plan.residual, {}).graph
    plan = named_for(plan, graph)
    widths = planned_widths(graph, plan, model)
    _check_seed_use(seed, importance, graph, widths)
    new, rebuilt = build_checked(graph, widths, plan, seed)
    if importance:
        gradients = taylor_gradients(model, data, defined) if importance == "taylor" else None
        _transfer.carry_weights(graph, new, widths, importance, gradients,
                                random.randrange(2**31) if seed is None else seed, new_graph=rebuilt)
    if defined is not model:  # back to the model's own, undefined spatial size
        clone = _with_inputs(new, input_specs(model))
        if importance:  # a clone has new layers: carry the weights once more
            clone.set_weights(new.get_weights())
        new = clone
    return new


def _plan_argument(plan):
    """The :class:`Plan` that ``apply_plan``'s ``plan=`` stands for: a plan, or a plan file's path.

    Raises:
        ArgumentError: a path that names no file, or a file that holds no plan.
        ArgumentTypeError: anything else.
    """
    if isinstance(plan, Plan):
        return plan
    if not isinstance(plan, (str, os.PathLike)):
        raise ArgumentTypeError("{plan:subject} must be a kp.Plan or the path of a plan file "
                                "(Plan.to_json's){got}.", plan=plan)
    path = os.fspath(plan)
    if not os.path.isfile(path):
        raise ArgumentError("{plan} names no file; give a kp.Plan or the path of a plan file "
                            "(written by plan.to_json(path) or `keras-precrop plan --out`).",
                            plan=path)
    try:
        return Plan.from_json(path)
    except ValueError as err:
        what = str(err).replace("{", "{{").replace("}", "}}")
        raise ArgumentError(f"{{plan}} holds no plan: {what}.", plan=path) from None


def _check_input_shapes(plan, model):
    """Refuse a plan made for inputs of other shapes (MACs and time depend on the size).

    Raises:
        PlanMismatchError: naming both shapes.
    """
    if plan.input_shapes is None:  # a plan written before shapes were recorded
        return
    planned = [tuple(shape) for shape in plan.input_shapes]
    shapes = [tuple(shape[1:]) for _, shape in input_specs(model)]
    if planned != shapes:
        raise PlanMismatchError(
            f"Plan for {plan.model_name!r} was made for input shape "
            f"{', '.join(map(str, planned))}, but model {model.name!r} takes "
            f"{', '.join(map(str, shapes))}: MACs and time depend on the input size, so a "
            "plan applies to a model built at the size it was planned for; plan this model "
            "anew with kp.plan(model, ...).")


def build_checked(graph, widths, plan, seed=None):
    """``graph``'s model rebuilt at ``widths`` (fresh weights) and its walk, checked against ``plan``.

    Raises:
        RebuildMismatchError: the rebuilt model's costs disagree with the plan
            (a model that disagrees is never returned).
    """
    new = rebuild(graph, widths, seed=seed)
    rebuilt, mismatch = _verify.check(new, graph, widths, plan)  # the one walk of the new model
    if mismatch is not None:
        raise RebuildMismatchError(
            f"Model {graph.model.name!r} rebuilt from plan for {plan.model_name!r} "
            f"disagrees with the plan: {mismatch}.")
    return new, rebuilt


def _counter_base(name):
    """A name without Keras' counter of unnamed layers: ``conv2d_4`` -> ``conv2d``."""
    return re.sub(r"_\d+$", "", name)


def named_for(plan, graph):
    """``plan`` in the names of ``graph``'s model: ``plan`` itself, or a renamed copy.

    Keras numbers unnamed layers per process (``conv2d``, ``conv2d_4``), so a
    second instance of the same architecture has other names. Where every
    width variable and layer differs from the plan's only by that counter,
    in the same order, the plan applies by place: its names are replaced by
    the model's. Anything else is left to :func:`planned_widths` to refuse.
    """
    pairs = [(v["name"], w.name) for v, w in zip(plan.variables, graph.variables)]
    pairs += [(row["name"], rec.path) for row, rec in zip(plan.layers, graph.layers)]
    if (len(plan.variables), len(plan.layers)) != (len(graph.variables), len(graph.layers)):
        return plan
    if all(a == b for a, b in pairs) or any(_counter_base(a) != _counter_base(b) for a, b in pairs):
        return plan
    names = dict(pairs)
    if len(names) != len(set(pairs)) or len(set(names.values())) != len(names):
        return plan  # the places disagree: a name would stand for two
    return dataclasses.replace(
        plan, variables=[{**v, "name": names[v["name"]]} for v in plan.variables],
        layers=[{**row, "name": names[row["name"]]} for row in plan.layers],
        ignore=[names.get(n, n) for n in plan.ignore])


def planned_widths(graph, plan, model):
    """The plan's width of every variable of ``graph`` (the walked ``model``), in order.

    Raises:
        PlanMismatchError: the plan was made for another architecture, or
            gives a width that is not a positive integer.
    """
    variables = graph.variables
    planned = {v["name"]: v for v in plan.variables}
    names = [v.name for v in variables]
    if set(names) != set(planned):
        extra, missing = sorted(set(planned) - set(names)), sorted(set(names) - set(planned))
        numbered = sorted(map(_counter_base, extra)) == sorted(map(_counter_base, missing))
        hint = (" The names differ only by Keras' counter of unnamed layers, which numbers them "
                "per process, but not in the same places: name the layers (name=...) to apply "
                "a plan to another instance." if numbered else "")
        raise PlanMismatchError(
            f"Plan for {plan.model_name!r} does not fit model {model.name!r}: "
            f"width variables only in the plan {extra[:5]}, only in the model {missing[:5]}.{hint}")
    for v in variables:
        if planned[v.name]["width"] != v.width:
            raise PlanMismatchError(
                f"Width variable {v.name!r} has {v.width} channels in model {model.name!r} "
                f"but {planned[v.name]['width']} in the plan.")
    widths = [planned[n]["new"] for n in names]
    for name, w in zip(names, widths):
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise PlanMismatchError(
                f"Plan for {plan.model_name!r} gives width variable {name!r} {w!r} channels; "
                "a width must be a positive integer (was the plan edited by hand?).")
    return widths


def _check_seed_use(seed, importance, graph, widths):
    """Refuse a ``seed`` that would seed nothing in ``apply_plan`` (see its docstring)."""
    if check_seed(seed) is None or importance in (None, "random"):
        return
    if any(w > v.width for w, v in zip(widths, graph.variables)) or random_layers(graph):
        return
    raise ArgumentError("{seed} seeds nothing here: with {weights:keep} every weight comes from the "
                        "model, {importance} ranks channels without chance, and no layer draws at "
                        "random; leave {seed:=} out.", seed=seed, importance=importance)


def taylor_gradients(model, data, defined=None):
    """The loss gradients of ``defined``'s trainable weights: ``{id(weight): array}`` per batch.

    They are computed on ``model``, whose input size is the data's;
    ``defined`` is ``model`` (the default) or its copy at a defined spatial
    size, with the same weights in the same order. The gradient machinery of
    each backend lives with the pruning baselines (``pai.gradients``), loaded
    here on use. ``model`` is not changed (its BatchNorm statistics neither).
    """
    defined = model if defined is None else defined
    gradients = importlib.import_module("keras_precrop.pai.gradients")
    ids = [id(w) for w in defined.trainable_weights]
    batches = list(gradients.batches(data))
    loss = functools.partial(gradients.cross_entropy,
                             from_logits=not outputs_probabilities(model, batches[0][0]))
    return [dict(zip(ids, gradients.weight_gradients(_loss(gradients, model, x, y, loss),
                                                     model.trainable_weights)))
            for x, y in batches]


def _loss(gradients, model, x, y, loss):
    """The cross-entropy of ``model``'s outputs on one batch, as a function of nothing.

    ``loss`` takes the outputs as logits, or as probabilities for a model that
    ends in a softmax (taken as logits, they would rank channels by a wrong
    gradient).
    """
    return lambda: gradients.loss_value(model, loss, x, y, training=False)


def precrop(model, params=None, flops=None, *, weights=None, importance=None, data=None, seed=None,
            **options):
    """PreCrop: a smaller, freshly initialized model meeting the budgets.

    Args:
        model: functional or Sequential Keras model with a defined input shape.
        params: parameter budget as a ratio of the original, in (0, 1]
            (e.g. 0.5); a larger budget is an error, since PreCrop only
            removes channels (:func:`reconfigure` lets layers grow).
        flops: FLOP budget as a ratio of the original, in (0, 1].
        **options: see :func:`plan` (``latency``, ``latency_model``,
            ``max_params``, ``max_macs``, ``mode``, ``round_to``,
            ``min_channels``, ``ignore``, ``residual``); e.g.
            ``precrop(model, latency=0.5)`` halves the predicted time.
        weights: ``"keep"`` prunes a trained model: the channels that
            survive keep their weights (see :func:`apply_plan`).
        importance: how the kept channels are ranked, as in :func:`apply_plan`.
        data: for ``importance="taylor"``, as in :func:`apply_plan`.
        seed: an integer fixes the new model's fresh weights (and
            ``importance="random"``) without touching Keras' global random
            state: two calls with the same seed give the same model. Refused
            where it seeds nothing (see :func:`apply_plan`).

    Returns:
        A new ``keras.Model``; its ``.precrop_plan`` attribute holds the plan.
    """
    if _transfer.check_options(weights, importance, data) == "taylor":  # before the solve
        data = check_data(model, data, "data").data
    check_seed(seed)
    options.setdefault("upper", 1.0)
    subject = Subject(model)  # one walk of the model for the plan, the rebuild and the weights
    the_plan = plan(subject, params, flops, **options)
    new = apply_plan(subject, the_plan, weights, importance, data, seed)
    new.precrop_plan = the_plan
    return new


def reconfigure(model, params=None, flops=None, **options):
    """PreConfig: re-distribute widths (layers may widen) under the budgets.

    Same arguments as :func:`precrop`, with no cap on widths by default
    (``upper=None``), for which ``mode="auto"`` picks ``"layerwise"`` (see
    the module docstring for why); e.g. ``reconfigure(model, params=0.8,
    flops=1.0)`` or ``reconfigure(model, params=0.8, latency=1.0)``. A latency model is
    fitted on narrower copies of the model, so widths beyond the original
    are extrapolated. With ``weights="keep"`` the original channels keep their
    weights and the new ones start out silent (see :func:`apply_plan`).
    """
    options.setdefault("upper", None)
    return precrop(model, params, flops, **options)
