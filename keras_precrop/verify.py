"""Checking a rebuilt model against the plan it was built from.

A plan predicts, layer by layer, the parameters, MACs and output width of the
model :func:`~keras_precrop.apply_plan` builds. :func:`check` walks
the rebuilt model afresh (its widths now come from the new layers' configs
and shapes, not from the plan) and compares the two, so a rebuild that
disagrees with its plan (a bug, or a plan edited by hand) is reported, naming
the first layer that differs, instead of handing back a wrong model.
:func:`build_checked` rebuilds and checks in one: what ``apply_plan`` and
``GradualPruning.finalize`` return is never a model that disagrees.
"""

from __future__ import annotations

from keras_precrop.budget import costs as _costs
from keras_precrop.errors import RebuildMismatchError, UnsupportedLayerError, UnsupportedModelError
from keras_precrop.graph import walker as _graph
from keras_precrop.graph.channels import channels_width
from keras_precrop.graph.rebuild import rebuild
from keras_precrop.subject import at_sizes_of


def _planned_width(graph, widths, rec):
    """Output channels of ``rec``'s first output under the planned widths."""
    return channels_width(rec.outputs[0][0], lambda s: graph.new_width(s, widths))


def build_checked(graph, widths, plan, seed=None, build=rebuild):
    """``graph``'s model rebuilt at ``widths`` (fresh weights) and its walk, checked against ``plan``.

    ``build(graph, widths, seed=seed)`` makes the model: the graph's rebuild
    by default; ``kp.hub`` re-creates a keras_hub task from its config instead.

    Raises:
        RebuildMismatchError: the rebuilt model's costs disagree with the plan
            (a model that disagrees is never returned).
    """
    new = build(graph, widths, seed=seed)
    rebuilt, mismatch = check(new, graph, widths, plan)  # the one walk of the new model
    if mismatch is not None:
        raise RebuildMismatchError(
            f"Model {graph.model.name!r} rebuilt from plan for {plan.model_name!r} "
            f"disagrees with the plan: {mismatch}.")
    return new, rebuilt


def check(new_model, graph, widths, plan):
    """Walk ``new_model`` once and find where it first disagrees with ``plan``.

    Args:
        new_model: the model rebuilt from ``graph`` with ``widths``.
        graph: the walked original model (:class:`graph.ModelGraph`).
        widths: the width of every variable of ``graph.variables`` used for
            the rebuild.
        plan: the :class:`~keras_precrop.Plan` whose per-layer costs
            (``params_new``, ``macs_new``) and totals were predicted.

    Returns:
        ``(rebuilt, mismatch)``: the walk of ``new_model`` (which carrying
        weights reads too, so the rebuilt model is walked once; ``None`` when
        it does not walk) and a sentence naming the first mismatching layer
        and both values, or ``None`` when every layer, and both totals, agree.
    """
    walked = at_sizes_of(new_model, graph.model, share_layers=True)  # its own layers, at the walk's sizes
    try:
        rebuilt = _graph.walk(walked, ignore=plan.ignore, residual="prefix", attention=plan.attention)
        prof = _costs.ModelProfile(rebuilt)
    except (UnsupportedLayerError, UnsupportedModelError) as err:
        return None, f"the rebuilt model's channels do not fit together: {str(err).rstrip('.')}"
    return rebuilt, _first_mismatch(rebuilt, prof, graph, widths, plan)


def _first_mismatch(rebuilt, prof, graph, widths, plan):
    """The first disagreement between the walked rebuilt model and ``plan``, or ``None``."""
    actual = {row.name: row for row in prof.layers}
    records = {rec.path: rec for rec in rebuilt.layers}
    planned = {layer["name"]: layer for layer in plan.layers}
    for rec in graph.layers:
        name = rec.path
        row, layer = actual.get(name), planned.get(name)
        if row is None or layer is None:
            where = "rebuilt model" if row is None else "plan"
            return f"layer {name!r} is missing from the {where}"
        for key, label in (("params", "parameters"), ("macs", "MACs")):
            have, want = getattr(row, key), layer[f"{key}_new"]
            if have != want:
                return f"layer {name!r} has {have:,} {label}; the plan predicts {want:,}"
        have = rebuilt.width(records[name].outputs[0][0])
        want = _planned_width(graph, widths, rec)
        if have != want:
            return f"layer {name!r} outputs {have} channels; the plan gives {want}"
    for row in prof.layers:  # inserted ChannelSlices cost nothing
        if row.name not in planned and (row.params or row.macs):
            return f"layer {row.name!r} is not in the plan but costs {row.params:,} parameters"
    for label, have, want in (("parameters", rebuilt.model.count_params(), plan.params),
                              ("MACs", prof.total_macs, plan.macs)):
        if have != want:
            return f"the rebuilt model has {have:,} {label} in total; the plan predicts {want:,}"
    return None
