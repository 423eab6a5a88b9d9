"""The planning floor: budgets in, a :class:`Plan` out, and back to a model.

The :class:`Plan` record, and how a plan meets the model it is applied to,
live in ``plans.py``; plans are plain JSON, so a plan computed once (on a
laptop, say) can be applied later to a model built inside a TPU or GPU
strategy scope with :func:`apply_plan`. The model a call works on, walked
once and copied to a defined spatial size where needed, is a ``Subject``
(``subject.py``); the kinds of budget and their argument names are
``budget/kinds.py``'s table.

This module only orchestrates the wings below it: it turns the user's
arguments into budgets by row name (``params``, ``macs``, ``latency``),
profiles the model (graph wing), fits or reads a latency model (latency
wing), solves (``budget.modes.solve``, where the translation modes live) and
rebuilds (``graph.rebuild``), checking the result (``verify``); with
``weights="keep"`` the transfer wing carries the trained weights over.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import random

import numpy as np

from keras_precrop import latency as _latency
from keras_precrop import transfer as _transfer
from keras_precrop.budget import costs as _costs
from keras_precrop.budget import kinds as _kinds
from keras_precrop.budget import tied as _tied
from keras_precrop.budget.modes import FLOOR_ON, MODES, solve
from keras_precrop.errors import ArgumentError, PlanMismatchError, RebuildMismatchError
from keras_precrop.graph.rebuild import check_seed, random_layers, rebuild
from keras_precrop.graph.trace import input_specs
from keras_precrop.graph.walker import ignore_names
from keras_precrop.plans import Plan, check_input_shapes, named_for, plan_argument, planned_widths
from keras_precrop.progress import check_verbose
from keras_precrop.subject import Subject, at_sizes_of
from keras_precrop.training._user_data import check_data
from keras_precrop.transfer.taylor import data_batches
from keras_precrop.verify import build_checked

__all__ = ["Plan", "PlanMismatchError", "RebuildMismatchError", "apply_plan", "plan", "precrop",
           "reconfigure"]

def plan(model, params=None, flops=None, *, max_params=None, max_macs=None,
         mode="auto", upper=1.0, round_to=1, min_channels=1, ignore=(),
         residual="prefix", latency=None, latency_model=None, balance=None, floor=None,
         floor_on=None, calibrate=None, tie=None, attention="heads"):
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
        ignore: layer names whose channels stay fixed (one string is one name);
            ``"auto"`` (alone or among the names) also keeps whole every layer
            the walk refuses with the remedy ``ignore=[...]``, walking again
            until none is refused: ``plan.ignore`` then lists the names,
            ``plan.solver["kept_whole"]`` says why each was kept, and
            ``plan.summary()`` prints it.
        residual: ``"prefix"`` (PreCrop residual rule) or ``"tie"``.
        attention: what ``MultiHeadAttention`` layers are pruned by:
            ``"heads"`` (whole heads: ``num_heads`` shrinks) or
            ``"head_dims"`` (every head stays and narrows: ``key_dim`` and
            ``value_dim`` shrink, the same in every head, as Torch-Pruning's
            ``prune_head_dims``); ``GroupQueryAttention`` layers by whole
            groups (a key-value head with its query heads) or ``head_dim``.
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
        tie: lists of width variable names (as ``plan.variables`` and the
            profile name them) whose widths keep one ratio (new / original)
            between them: every block's MLP equally wide, a transformer's
            heads and hidden width in the ratio of its fixed head size (what
            a config of one width per kind of layer can say; ``kp.hub``
            ties keras_hub backbones so). Exact or uniform mode (``"auto"``
            takes exact).

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
    budget_arguments = _kinds.given(locals())  # the budget table's keywords, as given
    can_grow = _check_options(mode, round_to, min_channels, upper, balance, floor, floor_on)
    ignore = ignore_names(ignore)  # ignore="stem" is one layer
    # Checked before profiling and timing, so a bad latency= fails at once.
    latency_budget = _costs.resolve_budget(_kinds.of_row(_latency.ROW), budget_arguments, 1.0, can_grow)
    measured_here = latency_model is None or isinstance(latency_model, dict)
    calibrate = _check_calibrate(calibrate, latency_budget is not None and measured_here,
                                 latency_budget is not None)
    subject = Subject.of(model)
    model, macs_arguments = subject.model, {**_kinds.counting_macs(budget_arguments),
                                            "latency_model": latency_model}
    measured = subject.defined(macs_arguments)
    prof = subject.profile(ignore, residual, macs_arguments, attention)
    ignore = prof.ignore  # ignore="auto" resolved into names; prof.kept_whole says why
    given = _counted_budgets(prof, budget_arguments, can_grow, latency_budget is not None)
    cm, timed, lm = prof.cost, {}, None
    if latency_budget is not None or latency_model is not None:
        lm = _latency.resolve(latency_model, model, residual=residual, attention=attention,
                              ignore=tuple(ignore), graph=prof.graph, round_to=round_to)  # its walk, grid
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

    ties = _ties(cm, tie, mode, round_to, min_channels)

    def solve_for(b):
        with _latency.floor_said(lm):  # a latency budget below it names it, with remedies
            widths, info, chosen = solve(
                prof, cm if ties is None else ties.cm, b, mode=mode if ties is None else
                ("exact" if mode == "auto" else mode), upper=upper, round_to=round_to,
                min_channels=min_channels, balance=balance, floor=floor, floor_on=floor_on,
                floor_at=budgets if calibrate else None, arguments=arguments)  # floor at the target
        return (widths, info, chosen) if ties is None else (ties.expand(widths), info, chosen)

    if calibrate:
        widths, info, mode = _calibrated(solve_for, prof, cm, model, lm, latency_model,
                                         (budgets, latency, calibrate))
    else:
        widths, info, mode = solve_for(budgets)
    if measured is not model:
        info["spatial_probe"] = list(measured.inputs[0].shape[1:])
    return _make_plan(prof, cm, widths, budgets, mode, list(ignore), {**info, **timed},
                      [list(shape[1:]) for _, shape in input_specs(model)])


def _calibrated(solve_for, prof, cm, model, lm, latency_model, budget):
    """``plan(calibrate=...)``: the widths ``solve_for`` plans, re-planned until their rebuilt
    model, timed against ``model`` as ``lm`` was fitted, meets the latency budget
    (``latency.calibrate.calibrated``); ``budget``: the budgets, the latency ratio and the
    rounds. Returns the widths, their info and the mode that planned them."""
    options = latency_model if isinstance(latency_model, dict) else {}
    ratio = _latency.time_ratio(lm, model, verbose=options.get("verbose", 1),
                                timer=options.get("timer"))
    chosen, built = {}, {}  # built: the last plan's model (a round timed again times it again)

    def solve_widths(b):
        widths, info, chosen["mode"] = solve_for(b)
        return widths, info

    def measure(w):
        key = w.astype(int).tobytes()
        if key not in built:
            built.clear()
            built[key] = rebuild(prof.graph, w.astype(int))
        return ratio(built[key])

    widths, info = _latency.calibrated(
        solve_widths, measure, lambda w: cm.totals(w)[cm.row_names.index(_latency.ROW)], *budget,
        runtime=lm.runtime)
    return widths, info, chosen["mode"]


def _counted_budgets(prof, budget_arguments, can_grow, timed):
    """``{row: (budget, (argument name, value)) or None}`` of the budgets that count (parameters,
    MACs), from ``budget_arguments`` (the budget table's keywords, as given).

    Raises:
        ArgumentError: a budget that counts MACs on a model whose MACs are unknown, or no budget
            at all (none counted, none ``timed``).
    """
    _costs.refuse_unknown_costs(prof, _kinds.counting_macs(budget_arguments))
    given = {kind.row: _costs.resolve_budget(kind, budget_arguments, getattr(prof, kind.total),
                                             can_grow)
             for kind in _kinds.KINDS if not kind.timed}
    if not timed and all(b is None for b in given.values()):
        wanted = _kinds.either("{" + name + ":=}" for name in _kinds.arguments())
        raise ArgumentError(f"Give at least one budget: {wanted}.")
    return given


def _ties(cm, tie, mode, round_to, min_channels):
    """The reduced cost model of ``tie`` (see ``budget/tied.py``), or ``None`` without one."""
    if tie is None:
        return None
    if mode not in ("auto", "exact", "uniform"):
        raise ArgumentError("{tie} needs mode='exact' or 'uniform' (or 'auto'), got {mode}: the "
                            "paper's layerwise rule sizes each layer on its own.", tie=tie, mode=mode)
    return _tied.tied(cm, _tied.tie_classes(cm.variables, tie), round_to, min_channels)


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


def _make_plan(prof, cm, widths, budgets, mode, ignore, info, input_shapes):
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
    renormalized = _renormalized(prof.graph, layers)
    if renormalized:
        info["renormalized"] = renormalized
    if prof.kept_whole:
        info["kept_whole"] = prof.kept_whole
    extra = cm.row_names[2:]  # e.g. latency: seconds, not counts
    return Plan(
        model_name=prof.model_name, mode=mode, residual=prof.graph.residual, ignore=ignore,
        variables=[{"name": v.name, "kind": v.kind, "width": int(v.width),
                    "new": int(widths[i]), "fixed": bool(v.fixed)}
                   for i, v in enumerate(cm.variables)],
        layers=layers,
        original={"params": prof.total_params, "macs": prof.total_macs,
                  **dict(zip(extra, map(float, cm.totals(cm.widths)[2:])))},
        predicted={"params": int(round(total[0])), "macs": int(round(total[1])),
                   **dict(zip(extra, map(float, total[2:])))},
        budgets={row: budgets.get(row) for row in cm.row_names},
        solver=info, input_shapes=input_shapes, attention=prof.graph.attention,
    )


def _renormalized(graph, layers):
    """The layers that compute statistics across channels (LayerNormalization) and lose some.

    Cutting the stream a norm reads is allowed (Minitron and Torch-Pruning
    prune transformers' hidden width so), but the kept channels are then
    normalized by other statistics: the plan says where, so a user who keeps
    trained weights knows why the outputs moved and fine-tunes.
    """
    first = {}
    for call in graph.calls:
        first.setdefault(call.record.path, call)
    cut = {row["name"] for row in layers if row["channels_in"] != row["channels_in_new"]}
    return [path for path, call in first.items()
            if path in cut and call.record.handler.mixes_statistics(call.record, call.node)]


def apply_plan(model, plan, weights=None, importance=None, data=None, seed=None, refit=False,
               verbose=1):
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
        importance: how channels are ranked with ``weights="keep"``: a name
            of the table of rankings or a ranking (see
            :func:`~keras_precrop.transfer.criteria.register_importance`):
            ``"l1"`` (default: the L1 norm of the weights that produce and
            consume a channel, each layer's share normalized), ``"l2"``,
            ``"taylor"`` (``|activation x gradient|`` on ``data``),
            ``"bn_scale"`` (the normalization scales) or ``"random"``
            (seeded by ``seed``).
        data: for a ranking that needs data (``importance="taylor"``) and
            for ``refit=True``: an ``(x, y)`` batch or an iterable of them
            (integer labels or one-hot; the model's outputs are taken as
            logits, or as probabilities where it ends in a softmax).
        seed: ``None`` (default): the fresh weights and ``importance="random"``
            draw from Keras' global random state (``keras.utils.set_random_seed``
            fixes it). An integer >= 0 fixes both (each layer's initializers and
            random layers get seeds derived from it and the layer's position)
            and leaves the global state untouched: the same seed gives the same
            model. Refused (``ArgumentError``) where it would seed nothing:
            kept weights ranked by ``"l1"``, ``"l2"`` or ``"taylor"``, with no
            channel gained and no random layer (``Dropout``, noise).
        refit: with ``weights="keep"`` and ``data``: after the cut, every
            linear projection (``Dense``, an attention layer's query, key,
            value and output ``EinsumDense``) is solved for by least squares,
            in call order, to give on ``data`` what the original's gave at
            the kept channels (``transfer/refit.py``; a forward pass of
            both models per batch and projection, stopped at it).
            Convolutions keep their carried weights. Refused where a layer
            gains channels. A model
            used as it is, or fine-tuned, starts nearer the original (the
            guide, "Refit").
        verbose: the refit's progress, as Keras' ``verbose``: 0 silent, 1
            (default) a line, then a bar per projection (plain lines off a
            terminal), 2 a line at the end.
    """
    return apply_with(model, plan, rebuild, weights, importance, data, seed, refit, verbose)


def apply_with(model, plan, build, weights=None, importance=None, data=None, seed=None,
               refit=False, verbose=1):
    """:func:`apply_plan`, the new model made by ``build(graph, widths, seed=seed)``.

    ``kp.hub`` re-creates a keras_hub task from a config of the plan's widths
    with it; the model is checked against the plan and takes its kept
    weights as a rebuild does.
    """
    importance = _transfer.check_options(weights, importance, data, refit=refit)
    check_verbose(verbose)
    plan = plan_argument(plan)
    subject = Subject.of(model)
    model = subject.model
    check_input_shapes(plan, model)
    if data is not None:  # it fits the model, before any work (a refit reads no labels)
        data = check_data(model, data, "data", labels=importance.needs_labels).data
    defined = subject.defined({})
    if importance and defined is not model:
        defined.set_weights(model.get_weights())
    graph = subject.profile(plan.ignore, plan.residual, {}, plan.attention).graph
    plan = named_for(plan, graph)
    widths = planned_widths(graph, plan, model)
    _check_seed_use(seed, importance, graph, widths)
    _check_refit(refit, graph, widths)
    new, rebuilt = build_checked(graph, widths, plan, seed, build)
    if importance:
        batches = data_batches(model, data, defined) if data is not None else None
        selection = _transfer.carry_weights(
            graph, new, widths, importance, batches if importance.needs == "data" else None,
            random.randrange(2**31) if seed is None else seed, new_graph=rebuilt)
    if defined is not model:  # back to the model's own, undefined spatial size
        clone = at_sizes_of(new, model)  # (a task kp.hub built from its config is there already)
        if importance and clone is not new:  # a clone has new layers: carry the weights once more
            clone.set_weights(new.get_weights())
        new = clone
    if refit:
        _transfer.refit_projections(graph, rebuilt, widths, selection, model, new,
                                    [x for x, _ in batches.batches], verbose)
    return new


def _check_refit(refit, graph, widths):
    """Refuse ``refit=True`` where a layer gains channels: they have no original to fit to."""
    grown = [v.name for w, v in zip(widths, graph.variables) if w > v.width]
    if refit and grown:
        raise ArgumentError("{refit} fits the kept channels to what the original computed; "
                            f"channels the plan adds ({grown}) have no such outputs. Leave "
                            "{refit:=} out, or plan with upper=1.0.", refit=refit)


def _check_seed_use(seed, importance, graph, widths):
    """Refuse a ``seed`` that would seed nothing in ``apply_plan`` (see its docstring)."""
    if check_seed(seed) is None or importance is None or importance.needs == "seed":
        return
    if any(w > v.width for w, v in zip(widths, graph.variables)) or random_layers(graph):
        return
    raise ArgumentError("{seed} seeds nothing here: with {weights:keep} every weight comes from the "
                        "model, {importance} ranks channels without chance, and no layer draws at "
                        "random; leave {seed:=} out.", seed=seed, importance=importance.given)


def precrop(model, params=None, flops=None, *, weights=None, importance=None, data=None, seed=None,
            refit=False, verbose=1, **options):
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
        data: for a ranking that needs data (``importance="taylor"``) and
            for ``refit``, as in :func:`apply_plan`.
        refit: refit the kept weights of every linear projection by least
            squares on ``data`` (see :func:`apply_plan`).
        seed: an integer fixes the new model's fresh weights (and
            ``importance="random"``) without touching Keras' global random
            state: two calls with the same seed give the same model. Refused
            where it seeds nothing (see :func:`apply_plan`).
        verbose: progress, as Keras' ``verbose`` (0 silent, 1 the default,
            2 a line at the end): of the latency measurement a ``latency``
            budget makes (unless ``latency_model`` is a dict that says its
            own ``verbose``) and of the refit.

    Returns:
        A new ``keras.Model``; its ``.precrop_plan`` attribute holds the plan.
    """
    check_option_names("precrop", options)
    ranking = _transfer.check_options(weights, importance, data, refit=refit)
    if data is not None:  # before the solve (a refit reads no labels)
        data = check_data(model, data, "data", labels=ranking.needs_labels).data
    check_seed(seed)
    options = {"upper": 1.0, **with_latency_verbose(options, verbose)}
    subject = Subject(model)  # one walk of the model for the plan, the rebuild and the weights
    the_plan = plan(subject, params, flops, **options)
    new = apply_plan(subject, the_plan, weights, importance, data, seed, refit, verbose)
    new.precrop_plan = the_plan
    return new


def with_latency_verbose(options, verbose):
    """``plan``'s ``options`` with ``verbose`` (checked) in the options of the latency model that
    a ``latency`` budget measures now (``latency_model`` None or a dict without ``verbose``)."""
    check_verbose(verbose)
    measured = options.get("latency_model")
    if options.get("latency") is None or not (measured is None or isinstance(measured, dict)):
        return options
    return {**options, "latency_model": {"verbose": verbose, **(measured or {})}}


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
    check_option_names("reconfigure", options, precrop)
    options.setdefault("upper", None)
    return precrop(model, params, flops, **options)


def check_option_names(caller, options, via=None):
    """Refuse a keyword that :func:`plan` does not take, as ``caller``'s own, with its likely spelling.

    ``precrop``/``reconfigure`` hand their other keywords to :func:`plan`, whose
    own ``TypeError`` would name ``plan()``, a function the user did not call.
    ``via``: a function between ``caller`` and :func:`plan` whose own keywords
    ``options`` may hold too (``reconfigure`` goes through ``precrop``).
    """
    known = [name for f in (plan, via) if f is not None
             for name, p in inspect.signature(f).parameters.items()
             if p.kind == p.KEYWORD_ONLY or name in ("params", "flops")]
    for name in options:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}"
                            + (f"; did you mean {near[0]!r}?" if near else ""))
