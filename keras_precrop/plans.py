"""The plan record, and how a plan meets the model it is applied to.

A :class:`Plan` is the bridge between solving and rebuilding: it records the
width chosen for every width variable (a channel group or a residual view;
see ``graph/channels.py`` for the vocabulary), the per-layer costs and
densities it implies, and how the budgets were met. Plans are plain JSON, so
a plan computed once (on a laptop, say) can be applied later to a model built
inside a TPU or GPU strategy scope with :func:`~keras_precrop.apply_plan`.
A plan file may have been edited by hand: :meth:`Plan.from_json` checks its
fields once, naming the file and the field at fault.

Applying a plan to a model starts here: :func:`named_for` renames a plan made
on another instance of the architecture (Keras numbers unnamed layers per
process), :func:`planned_widths` reads its widths in the model's order,
refusing a plan made for another architecture or input size.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from keras_precrop import _json, _tables
from keras_precrop._json import BOOLEAN, COUNT, NULL, NUMBER, OBJECT, POSITIVE, STRING, Nullable, one_of
from keras_precrop.errors import ArgumentError, ArgumentTypeError, PlanMismatchError
from keras_precrop.graph.trace import input_specs

__all__ = ["Plan", "named_for", "planned_widths"]

_OLD_KEYS = {"groups": "variables"}  # JSON keys of older plans -> Plan fields

_VARIABLE = {"name": STRING, "kind": STRING, "width": POSITIVE, "new": POSITIVE, "fixed": BOOLEAN}
_TOTALS = {"params": COUNT, "macs": COUNT, "*": NUMBER}  # and extra rows (latency: seconds)
# What a plan file must hold for the package to read it: the fields of :class:`Plan`, each
# variable's and layer's keys, and the solver's diagnostics that tables read (others pass).
_PLAN_FILE = {
    "model_name": STRING, "mode": STRING, "residual": one_of("prefix", "tie"),
    "ignore": [STRING],
    # Older plans call the variables "groups"; Plan.from_dict has made sure one of them is there.
    "variables?": [_VARIABLE], "groups?": [_VARIABLE],
    "layers": [{"name": STRING, "class_name": STRING, "channels": STRING, "channels_new": STRING,
                "channels_in?": STRING, "channels_in_new?": STRING, "params": COUNT,
                "params_new": COUNT, "macs": COUNT, "macs_new": COUNT,
                "density": NUMBER | NULL}],
    "original": _TOTALS, "predicted": _TOTALS, "budgets": {"*": NUMBER | NULL},
    "solver": {"objective?": NUMBER, "floor?": NUMBER, "floor_on?": STRING, "auto_mode?": STRING,
               "uniform_ratio?": NUMBER, "floor_ratio?": NUMBER, "kept_whole?": {"*": STRING},
               "floor_at?": STRING, "floor_binds?": [STRING],
               "latency_model?": {"runtime": STRING, "batch_size": POSITIVE, "training": BOOLEAN},
               "latency_calibration?": {"measured": NUMBER, "target": NUMBER, "met": BOOLEAN,
                                        "rounds": [OBJECT]}},
    "input_shapes?": Nullable([[POSITIVE | NULL]]),
    "attention?": one_of("heads", "head_dims"),
}


@dataclasses.dataclass
class Plan(_json.JsonDataclass):
    """Channel widths for a model, with the costs they imply.

    Attributes:
        model_name: name of the model the plan was made for.
        mode: ``"exact"``, ``"layerwise"``, ``"paper"`` or ``"uniform"`` (what ``"auto"``
            chose, with the reason in ``solver["auto_mode"]``).
        residual: residual semantics used (``"prefix"`` or ``"tie"``).
        ignore: layer names whose channels were kept fixed (``ignore="auto"``
            resolved into names; ``solver["kept_whole"]`` says why "auto" kept each).
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
        attention: what attention layers were pruned by: ``"heads"`` (whole
            heads; plans written before the choice existed) or ``"head_dims"``
            (each head's dimension).

    With a latency model, ``original``, ``predicted`` and ``budgets`` also
    hold ``"latency"`` (seconds per batch, as the latency model predicts) and
    ``solver["latency_model"]`` says what was timed.

    :meth:`from_json` checks a plan file's fields as it reads it: one the
    package cannot use (a width that is no positive integer, a missing key)
    raises :class:`ValueError` naming the file and the field
    (``file 'plan.json': variables[3].new must be a positive integer, got 'abc'``).
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
    attention: str = "heads"
    _SCHEMA = _PLAN_FILE  # what from_json checks: a plan file may have been edited by hand

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
        units = {v["name"]: v for v in self.variables if v["kind"] in _UNIT_KEYS}
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
                _change(layer["channels"], layer["channels_new"]) + _units_cell(layer, units),
                _change(f"{layer['params']:,}", f"{layer['params_new']:,}"),
                _change(f"{layer['macs']:,}", f"{layer['macs_new']:,}"),
                "" if layer["density"] is None else f"{layer['density']:.3f}",
            ))
        auto = ', picked by mode="auto"' if "auto_mode" in self.solver else ""
        rules = f"residual={self.residual}" + (", attention=head_dims" * (self.attention == "head_dims"))
        print_fn(f'Plan ({self.mode_label}{auto}, {rules}): "{self.model_name}"')
        if self.solver.get("floor_at") == "target":  # calibration lowered the budget, not the floor
            held = self.solver.get("floor_binds")
            what = "Residual streams" if self.solver.get("floor_on") == "streams" else "Widths"
            print_fn(f"Floor: {what} held through calibration at the uniform plan's widths at the "
                     f"target (width factor {self.solver['floor_ratio']:.3f})"
                     + (f"; at the floor: {', '.join(held)}" if held else ""))
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
        renormalized = self.solver.get("renormalized")
        if renormalized:
            print_fn(f"Note: {len(renormalized)} layer{'s' * (len(renormalized) > 1)} that "
                     f"normalize across channels lose some ({', '.join(renormalized[:3])}"
                     f"{', ...' if len(renormalized) > 3 else ''}): the channels kept are "
                     "normalized by other statistics, so kept weights compute something new "
                     "there until fine-tuned.")
        for line in _tables.kept_whole_lines(self.solver.get("kept_whole", {})):
            print_fn(line)


# The config key an attention layer's units change, by the walk's unit kind and the layer's class
# (``graph/attention.py``, ``graph/gqa.py``); other attention classes: the kind's own words.
_UNIT_KEYS = {"heads": {"MultiHeadAttention": "num_heads", "GroupQueryAttention": "num_key_value_heads",
                        None: "heads"},
              "head_dims": {"MultiHeadAttention": "key_dim", "GroupQueryAttention": "head_dim",
                            None: "head dims"}}


def _units_cell(layer, units):
    """`` (num_heads 4 -> 2)``: what the plan does to the units an attention layer creates, else ""."""
    unit = units.get(layer["name"])
    if unit is None:
        return ""
    keys = _UNIT_KEYS[unit["kind"]]
    key = keys.get(layer["class_name"], keys[None])
    return f" ({key} {_change(str(unit['width']), str(unit['new']))})"


def _change(before, after):
    """A table cell: ``before -> after``, or one value if it did not change."""
    return before if before == after else f"{before} -> {after}"


def plan_argument(plan):
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
                            "(written by plan.to_json(path) or `keras-precrop precrop MODEL --plan FILE`).",
                            plan=path)
    try:
        return Plan.from_json(path)
    except _json.FieldError as err:  # a plan, edited by hand: the field at fault
        what = f"{err.field} {err.reason}".replace("{", "{{").replace("}", "}}")
        raise ArgumentError(f"{{plan}}: {what}; a plan file holds what plan.to_json(path) "
                            "writes.", plan=path) from None
    except ValueError as err:
        what = str(err).replace("{", "{{").replace("}", "}}")
        raise ArgumentError(f"{{plan}} holds no plan: {what}.", plan=path) from None


def check_input_shapes(plan, model):
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
    _refuse_broken_groups(graph, plan, widths)
    return widths


def _refuse_broken_groups(graph, plan, widths):
    """Refuse a width that a grouped layer (``groups=``, ``GroupNormalization``) reading or
    writing it cannot split into its groups, before Keras' own error deep in the rebuild.

    Raises:
        PlanMismatchError: naming the width variable, the layer, its groups and the width.
    """
    for v, w in zip(graph.variables, widths):
        if w == v.width or w % v.multiple == 0:
            continue
        grouped = [rec for rec in graph.layers
                   if rec.path in v.layers and getattr(rec.layer, "groups", 1) > 1]
        by = (f"layer {grouped[0].path!r} ({grouped[0].class_name}, groups="
              f"{grouped[0].layer.groups}) splits them into groups" if grouped
              else "a grouped layer splits them into groups")
        raise PlanMismatchError(
            f"Plan for {plan.model_name!r} gives width variable {v.name!r} {w} channels, but {by}: "
            f"its width must be a multiple of {v.multiple}. Give {v.name!r} a multiple of "
            f"{v.multiple} (as kp.plan does), or keep {v.width}.")


