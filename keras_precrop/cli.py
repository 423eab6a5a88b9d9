"""The ``keras-precrop`` command line: profile, precrop, reconfigure and prune-trained.

Examples::

    keras-precrop profile resnet20
    keras-precrop precrop resnet20 --params 0.3 --out small.keras
    keras-precrop reconfigure efficientnet_b0 --params 0.8 --flops 1.0 --plan plan.json
    keras-precrop precrop trained.keras --apply plan.json --out small.keras
    keras-precrop precrop trained.keras --params 0.5 --weights fresh --seed 1 --out small.keras
    keras-precrop latency resnet20 --batch_size 64 --json resnet20_latency.json
    keras-precrop precrop resnet20 --latency 0.5 --latency_model resnet20_latency.json
    keras-precrop prune-trained trained.keras --latency 0.5 --data cifar10 --epochs 3 --out small.keras

Errors are one line naming the flag at fault as the user typed it; a flag that
would do nothing in its command (a budget next to ``--apply``, a timing flag
where nothing is timed) is such an error rather than silently ignored.

A model read from a file keeps its trained weights in the model ``--out``
saves (``--weights keep``, the default there); a zoo model starts fresh.

The parser imports nothing heavy (``import keras_precrop`` loads no Keras), so
``--help`` and argument errors answer without TensorFlow.
"""

from __future__ import annotations

import math
import os
import sys

import keras_precrop as kp
from keras_precrop import _cli_flags as _flags
from keras_precrop import _cli_trained as _trained
from keras_precrop import _startup
from keras_precrop.budget import kinds as _kinds
from keras_precrop.transfer import criteria as _criteria

_AUTO = "auto"  # --ignore auto: the walker's AUTO (keep whole every layer the walk refuses)


def _model_name(args):
    """The model, given once: as the argument or as ``--model`` (a saved one must exist)."""
    if (args.model is None) == (args.model_flag is None):
        raise ValueError("give the model once: `keras-precrop CMD resnet20` or `--model resnet20`")
    model = args.model or args.model_flag
    if _is_file(model) and not os.path.exists(model):
        raise FileNotFoundError(f"no such model file: {model}")
    return model


def _is_file(model):
    """Whether the model argument names a saved model rather than a zoo model."""
    return model.endswith(".keras") or os.path.exists(model)


def _load_saved(path):
    """The model saved at ``path`` (uncompiled); a file Keras cannot read is named as such."""
    import keras  # noqa: PLC0415  (after the arguments are parsed: see the module docstring)

    try:
        return keras.models.load_model(path, compile=False)
    except (ValueError, OSError) as err:
        if not os.path.isfile(path):
            raise
        raise ValueError(f"MODEL {path} is no model Keras can load (a .keras archive that "
                         f"model.save() wrote): {err}") from None


def _load_model(args):
    """The model to work on: a saved ``.keras`` file, or a zoo model built at ``--input_shape``."""
    if _is_file(args.model):
        return _load_saved(args.model)
    shape = None
    if args.input_shape:
        try:
            shape = tuple(int(d) for d in args.input_shape.split(","))
        except ValueError:
            raise ValueError(
                f"--input_shape must be integers like 32,32,3, got {args.input_shape!r}") from None
    return kp.models.get(args.model, input_shape=shape, num_classes=args.num_classes)


def _ignore(args):
    return [n for n in args.ignore.split(",") if n]


def _timing(args):
    """Options of ``kp.latency_model`` from the timing flags."""
    return {keyword: getattr(args, keyword) for keyword in _flags.TIMING}


def _no_effect(args):
    """``(keywords, why)`` pairs: options that would do nothing in this command, and why."""
    rules = []
    if _is_file(args.model):
        rules.append((("input_shape", "num_classes"),
                      "on a saved model: its file fixes the input shape and classes"))
    if args.command == "compare" and not args.measure and args.latency_model:
        rules.append((_flags.TIMING, "with --latency_model and without --measure: nothing is timed"))
    elif args.command == "compare" and not args.measure and args.latency is None:
        rules.append((_flags.TIMING, "without --latency or --measure: nothing is timed"))
    if args.command in _flags.PLANNERS:
        rules += _keep_effect(args)
        if args.apply:
            rules.append((_SOLVING, "with --apply: the plan fixes the widths"))
        elif args.latency_model:
            rules.append((_flags.TIMING, "with --latency_model: that latency model is timed already"))
        elif args.latency is None:
            rules.append((_flags.TIMING, "without --latency: nothing is timed"))
    return rules


def _keep_effect(args):
    """The ``_no_effect`` rules of the weight flags of ``precrop``/``reconfigure``."""
    if not args.out:
        return [(("weights", "importance", "seed"), "without --out: the plan is the same, only the "
                 "saved model has weights")]
    if _weights(args) == "keep":
        return []  # a seed that seeds nothing is the library's to refuse: it knows the plan
    why = ("with --weights fresh" if args.weights else
           f"on zoo model {args.model}, whose weights are fresh anyway")
    return [(("importance",), f"{why}: no channel keeps a trained weight")]


def _weights(args):
    """``--weights`` as typed, or its default: keep a saved model's weights, start a zoo model fresh."""
    return args.weights or ("keep" if _is_file(args.model) else "fresh")


def _weight_options(args):
    """``apply_plan``'s weight options (``weights``, ``importance``, ``seed``) from the flags."""
    if _weights(args) == "fresh":
        return dict(seed=args.seed)
    if not _is_file(args.model):
        raise ValueError(f"--weights keep keeps a trained model's weights, and {args.model} is a zoo "
                         "model with fresh ones; give a trained .keras file.")
    return dict(weights="keep", importance=args.importance or "l1", seed=args.seed)


def _check_out(args):
    """Refuse, before any work, an output file that could not be written, and an ``--out`` that
    would save a model Keras cannot load back."""
    out = getattr(args, "out", None)
    if out and _is_file(args.model) and _same_file(out, args.model):
        raise _UsageError(f"--out {out} is MODEL {args.model} itself: saving there would overwrite "
                          "the trained model being pruned; give --out another path, e.g. --out "
                          f"{os.path.splitext(out)[0]}_pruned.keras.")
    if out and not out.endswith(".keras"):
        raise ValueError(f"--out {out}: a rebuilt model is saved as a .keras file (Keras' legacy "
                         ".h5 format cannot load its ChannelSlice and PrefixAdd layers); use e.g. "
                         f"--out {os.path.splitext(out)[0]}.keras.")
    for flag in ("out", "plan", "json"):
        path = getattr(args, flag, None)
        folder = os.path.dirname(os.path.abspath(path)) if isinstance(path, str) else None
        if folder is not None and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            raise ValueError(f"--{flag} {path}: cannot write into {folder} (no such folder, or not "
                             "writable); create it or pick another path.")


def _same_file(a, b):
    """Whether paths ``a`` and ``b`` name one file: the same path once symbolic links and
    relative parts are resolved, or (for one that exists) the same file on disk (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


class _UsageError(ValueError):
    """A command line at odds with itself (``--out`` naming the MODEL it reads): exit status 2,
    as for argparse's usage errors, before anything is loaded."""


def _refuse_unused(args):
    """Raise for the first typed option that would be silently ignored here.

    Options that mean nothing in a command (a budget next to ``--apply``, a
    timing flag when nothing is timed) are refused, naming the option as
    typed, rather than ignored: the user asked for something they would not
    get.
    """
    for keywords, why in _no_effect(args):
        for keyword in keywords:
            if keyword in args.typed:
                raise ValueError(f"{_flag(keyword, getattr(args, keyword))} has no effect {why}.")


def _check_against_plan(args, plan):
    """Refuse a plan ``args.command`` does not make, or flags the plan overrides.

    ``precrop`` only removes channels, so it refuses a plan that grows a
    width (a ``reconfigure`` plan). ``--residual``, ``--attention`` and ``--ignore`` typed with
    ``--apply`` must be the plan's own: ``apply_plan`` walks the model with the
    residual semantics and ignored layers the plan was made with, so other
    values would be ignored.
    """
    grown = [v for v in plan.variables if v["new"] > v["width"]]
    if args.command == "precrop" and grown:
        v = grown[0]
        raise ValueError(
            f"--apply {args.apply} grows {len(grown)} width(s) (e.g. {v['name']} from "
            f"{v['width']} to {v['new']} channels), and precrop only removes channels; "
            f"apply it with `keras-precrop reconfigure MODEL --apply {args.apply}`.")
    ignore = sorted(_ignore(args))
    if _AUTO in ignore and set(ignore) - {_AUTO} <= set(plan.ignore):
        ignore = sorted(plan.ignore)  # what 'auto' resolved to when the plan was made
    for keyword, typed, planned in (("residual", args.residual, plan.residual),
                                    ("attention", args.attention, plan.attention),
                                    ("ignore", ignore, sorted(plan.ignore))):
        if keyword in args.typed and typed != planned:
            made = f"with {_flag(keyword, planned)}" if planned else f"without --{keyword}"
            raise ValueError(f"{_flag(keyword, typed)} does not match --apply {args.apply}, "
                             f"a plan made {made}.")


def _read(kind, keyword, args):
    """The :class:`kp.Plan` or :class:`kp.LatencyModel` (``kind``) in option ``keyword``'s JSON.

    The option names a JSON file (or holds JSON text, as ``from_json`` reads
    it); content of another kind is refused naming the option.
    """
    path = getattr(args, keyword)
    if not str(path).lstrip().startswith("{"):  # a file that cannot be read: OSError, named by
        with open(path, encoding="utf-8"):    # its flag (see _error_line), as for every file
            pass
    try:
        return kind.from_json(path)
    except ValueError as err:  # not JSON, or JSON of something else
        what, remedy = _READS[keyword]
        raise ValueError(f"{_flag(keyword, path)} does not hold a {what} ({err}); "
                         f"{remedy}.") from None


def _run(args):
    """Runs the parsed subcommand: loads its model and hands it to the subcommand's runner."""
    if args.command == "list":
        print("\n".join(kp.models.list()))
        return
    if args.command == "prune-trained":
        _run_prune_trained(args)
        return
    args.model = _model_name(args)
    _refuse_unused(args)
    _check_out(args)
    model = _load_model(args)
    {"latency": _run_latency, "profile": _run_profile, "compare": _run_compare}.get(
        args.command, _run_planner)(args, model)


def _run_latency(args, model):
    ignore, graph = _ignore(args), None
    if _AUTO in ignore:  # resolved into names as kp.plan does; the walk handed down
        prof = kp.profile(model, ignore=ignore, residual=args.residual, attention=args.attention)
        ignore, graph = prof.ignore, prof.graph
    fitted = kp.latency_model(model, **_timing(args), ignore=ignore, residual=args.residual,
                              attention=args.attention, graph=graph)
    fitted.summary()
    if args.json:
        fitted.to_json(args.json)
        print(f"Latency model written to {args.json}")


def _run_profile(args, model):
    prof = kp.profile(model, ignore=_ignore(args), residual=args.residual, attention=args.attention)
    prof.summary(only_costly=not args.all_layers, show_all_hint="--all")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(prof.to_json(indent=1))


def _latency_model(args):
    """What ``--latency_model`` or the timing flags give ``latency_model=``, or None."""
    if args.latency_model:
        _read(kp.LatencyModel, "latency_model", args)  # a flag-named error if it is no model
        return args.latency_model  # as a path, so that a mismatch names the file
    return _timing(args) if args.latency is not None else None


def _solve_options(args):
    """``kp.plan``'s keyword arguments from the budget flags (``precrop``, ``reconfigure``, ``compare``)."""
    return dict(_budgets(args), round_to=args.round_to,
                min_channels=args.min_channels, ignore=_ignore(args), residual=args.residual,
                attention=args.attention, upper=None if args.command == "reconfigure" else 1.0,
                latency_model=_latency_model(args), calibrate=args.calibrate)


def _budgets(args):
    """``{keyword: value}`` of the budget flags this command has (``budget.kinds``' keywords)."""
    return {name: getattr(args, name) for name in _kinds.arguments() if name in vars(args)}


def _run_compare(args, model):
    modes = [m for m in args.modes.split(",") if m]
    comparison = kp.compare(model, modes=modes, measure=args.measure,
                            batch_size=args.batch_size, runtime=args.runtime,
                            rounds=args.rounds, **_solve_options(args))
    comparison.summary()
    if args.json:
        comparison.to_json(args.json)
        print(f"Comparison written to {args.json}")


def _run_planner(args, model):
    """Solve (or read) the plan, build its model, then print and save: a refusal prints nothing.

    A plan given with ``--apply`` is always built on the model, so that one
    made for another model is refused before its table is printed.
    """
    options = _weight_options(args) if args.out else {}
    if args.apply:
        the_plan = _read(kp.Plan, "apply", args)
        _check_against_plan(args, the_plan)
    elif _of_hub(args, model):
        the_plan = None  # kp.hub solves it, with the backbone's own residual semantics
    else:
        the_plan = kp.plan(model, mode=args.mode, balance=args.balance,
                           floor=args.floor, floor_on=args.floor_on, **_solve_options(args))
    if _of_hub(args, model):  # the same keras_hub classes back: always built, as kp.hub does
        new = _hub_pruned(args, model, the_plan, options)
        the_plan = new.precrop_plan
    else:
        new = _applied(args, model, the_plan, options) if args.out or args.apply else None
    _print_plan(args, the_plan)
    if not args.apply:
        _refuse_unmet_latency(args, the_plan)
    if args.plan:
        the_plan.to_json(args.plan)
        print(f"Plan written to {args.plan}")
    if args.out:
        save_loadable(new, args.out)
        print(f"Model written to {args.out} ({new.count_params():,} params; {_which(options)})")


def _of_hub(args, model):
    """Whether ``model`` is a keras_hub task or backbone, which ``kp.hub`` prunes; ``--homogeneous``
    on any other model is refused: it would do nothing."""
    hub = type(model).__module__.startswith("keras_hub.") or isinstance(model, kp.hub.PrunedBackbone)
    if not hub and "homogeneous" in args.typed:
        typed = "--homogeneous" if args.homogeneous else "--no-homogeneous"
        raise ValueError(f"{typed} has no effect on {args.model}, "
                         f"a {type(model).__name__}: only a keras_hub task or backbone has blocks "
                         "that a config states the widths of.")
    return hub


def _hub_pruned(args, model, the_plan, options):
    """The keras_hub task (or backbone) ``model`` pruned as ``kp.hub`` does, of the same classes:
    ``the_plan`` (``--apply``) replayed, or one solved for the budget flags."""
    if the_plan is not None:
        try:
            return kp.hub.apply_plan(model, the_plan, **options)
        except kp.PlanMismatchError as err:
            raise ValueError(f"--apply {args.apply} does not fit {args.model}: {err}") from None
    solve = {k: v for k, v in _solve_options(args).items()
             if k != "residual" or "residual" in args.typed}  # else the backbone's own (BERT: tie)
    method = kp.hub.reconfigure if args.command == "reconfigure" else kp.hub.precrop
    return method(model, mode=args.mode, balance=args.balance, floor=args.floor,
                  floor_on=args.floor_on, homogeneous=args.homogeneous, **solve, **options)


def save_loadable(model, path):
    """Save ``model`` to ``path`` and load it back: a file Keras cannot read is removed, not left.

    A layer that a repair re-created (keras_hub 0.32's Swin ``PatchEmbedding``,
    ``DINOV3Attention``, ``SegFormerMultiheadAttention``: their own configs do not
    re-create them) saves, but no one can load the file.

    Raises:
        ValueError: naming ``--out``, Keras' reason and the remedy.
    """
    import keras  # noqa: PLC0415  (after the arguments are parsed: see the module docstring)

    model.save(path)
    try:
        keras.models.load_model(path, compile=False)
    except (ValueError, TypeError) as err:
        os.remove(path)
        raise ValueError(
            f"--out {path}: the pruned model was saved, but Keras cannot load it back "
            f"({str(err).splitlines()[0][:200]}), so no file is written. A layer's config does not "
            "re-create it; where a keras_hub backbone's config can say its widths (ViT, DeiT, BERT), "
            "--homogeneous re-creates the model from a config of its own classes; else export the "
            "pruned model in Python (model.export).") from None


def _print_plan(args, the_plan):
    """The plan's table of the layers it changes (every layer with ``--all``) and its totals;
    with ``--quiet`` its totals alone."""
    if not args.quiet:
        the_plan.summary(only_changed=not args.all_layers, show_all_hint="--all")
        return
    table = ("+", "|")  # the lines of the per-layer table (keras_precrop/_tables.py)
    the_plan.summary(print_fn=lambda line: None if line.startswith(table) else print(line))


def _refuse_unmet_latency(args, the_plan):
    """Refuse a latency plan whose calibration measured it over ``--latency`` ("NOT met" in its
    table), before anything is written: the budget is a promise about time on this machine."""
    calibration = the_plan.solver.get("latency_calibration")
    if not calibration or calibration["met"]:
        return
    rounds, measured = len(calibration["rounds"]), calibration["measured"]
    remedies = [f"loosen the budget to what this machine reaches, e.g. --latency "
                f"{math.ceil(measured * 100) / 100:g}"]
    if "calibrate" in vars(args):
        remedies.insert(0, f"calibrate for more rounds (--calibrate {2 * rounds})")
    solver = the_plan.solver
    if solver.get("floor_at") == "target" and solver.get("floor_binds"):  # what held it back
        streams = solver.get("floor_on") == "streams"
        remedies.insert(0, f"let the {'residual streams' if streams else 'widths'} go below the "
                           "uniform plan's widths at the target, where they were held ("
                           f"{', '.join(solver['floor_binds'][:3])}): --floor "
                           f"{round(0.7 * solver['floor'], 2):g}{' --floor_on streams' * streams}")
    raise ValueError(
        f"{_flag('latency', args.latency)} is not met: the plan measured {measured:.1%} of the "
        f"original's time after {rounds} calibration round{'s' * (rounds > 1)} (target "
        f"{calibration['target']:.1%}), so nothing was written. To go on, "
        f"{', or '.join(remedies)}; a latency model fitted on more variants (`keras-precrop latency "
        "MODEL --variants 40 --rounds 7 --json lm.json`, then --latency_model lm.json) predicts "
        "plans closer to their measured time.")


def _applied(args, model, the_plan, options):
    """``apply_plan`` of the plan; a plan of ``--apply`` that does not fit the model names the flag."""
    try:
        return kp.apply_plan(model, the_plan, **options)
    except kp.PlanMismatchError as err:
        if not args.apply or err.arguments:
            raise
        raise ValueError(f"--apply {args.apply} does not fit {args.model}: {err}") from None


def _which(options):
    """The weights the saved model starts from, in words."""
    seeded = "" if options.get("seed") is None else f", --seed {options['seed']}"
    if options.get("weights") == "keep":
        return f"weights kept: the trained channels {options['importance']} ranks first{seeded}"
    return f"fresh weights{seeded}"


# -- prune-trained: gradual pruning of a trained model while it trains (issue 43) -------------


def _check_prune_trained(args):
    """Refuse, naming the flag, what ``prune-trained`` cannot do; before anything is loaded."""
    if not args.model.endswith(".keras"):
        raise ValueError(f"MODEL {args.model}: prune-trained prunes a trained model saved as a .keras "
                         "file (model.save('trained.keras')).")
    if not os.path.exists(args.model):
        raise ValueError(f"no such model file: {args.model}")
    _check_out(args)
    ratios = [kind.ratio for kind in _kinds.KINDS]
    budgets = [k for k in (*ratios, "latency_model") if getattr(args, k) is not None]
    if args.apply and "homogeneous" in args.typed:
        budgets.append("homogeneous")
    if args.apply and budgets:
        raise ValueError(f"{_flag(budgets[0], getattr(args, budgets[0]))} has no effect with "
                         f"--apply {args.apply}: the plan fixes the widths.")
    if not args.apply and not set(ratios) & set(budgets):
        flags = _kinds.either(f"--{ratio}" for ratio in ratios)
        raise ValueError(f"Give the widths to prune to: a budget ({flags}) or --apply PLAN.json.")
    if args.batch_size < 1:
        raise ValueError(f"{_flag('batch_size', args.batch_size)} must be a positive integer.")
    _check_epochs(args)
    if not 0 < args.learning_rate < math.inf:
        raise ValueError(f"{_flag('learning_rate', args.learning_rate)} must be a positive number.")
    if args.gradual_epochs is not None and not 0 <= args.gradual_epochs <= args.epochs:
        raise ValueError(f"{_flag('gradual_epochs', args.gradual_epochs)} must be between 0 and "
                         f"--epochs {args.epochs}: the channels go during training.")
    if not 0 <= args.shrink < 1:
        raise ValueError(f"{_flag('shrink', args.shrink)} must be in [0, 1): the share of a doomed "
                         "channel's weights taken away at each step.")
    if args.refit and args.gradual_epochs:
        raise ValueError(f"--refit has no effect with {_flag('gradual_epochs', args.gradual_epochs)}: "
                         "it cuts at once and refits before training; leave --gradual_epochs out.")
    if args.shrink and (args.gradual_epochs == 0 or args.refit):
        cause = "--refit" if args.refit else "--gradual_epochs 0"
        raise ValueError(f"{_flag('shrink', args.shrink)} has no effect with {cause}: the "
                         "channels go at once, before any step.")
    _trained.check_data_spec(args)
    _trained.check_split(args)


def _check_epochs(args):
    """``--epochs``: positive, or 0 with ``--refit`` (cut, refit, no training), where the flags
    of the training typed beside it are refused rather than ignored."""
    if args.epochs < 0 or (args.epochs == 0 and not args.refit):
        raise ValueError(f"{_flag('epochs', args.epochs)} must be a positive integer (0 only with "
                         "--refit, which cuts and refits before any training).")
    training = [k for k in ("distill", "learning_rate", "gradual_epochs") if k in args.typed]
    if args.epochs == 0 and training:
        raise ValueError(f"{_flag(training[0], getattr(args, training[0]))} has no effect with "
                         "--epochs 0: nothing trains.")


def _run_prune_trained(args):
    """Load, plan, train while pruning (distilled by default), rebuild smaller, evaluate, save."""
    _check_prune_trained(args)
    original = _load_saved(args.model)
    train, test, steps = _trained.prune_data(args, original)
    _trained.check_prune_data(args, original, train, test)
    the_plan = _prune_plan(args, original)
    _print_plan(args, the_plan)
    _refuse_unmet_latency(args, the_plan)
    first = _trained.first_batches(train, args.batch_size)
    _trained.warn_at_chance(args, original, first)
    # The model that trains (pruned already, or masked as it trains); the original stays whole
    # and teaches.
    student, pruning = _student(args, original, the_plan, first, steps)
    teacher = original if args.distill else None
    small = _trained.train_pruned(args, student, teacher, train, test, pruning, steps)
    if test is not None:
        from keras_precrop.training.finetune import accuracy  # noqa: PLC0415  (as keras above)

        print(f"Test accuracy: {accuracy(original, test, args.batch_size):.4f} original, "
              f"{accuracy(small, test, args.batch_size):.4f} pruned")
    save_loadable(small, args.out)
    _trained.print_pruned(args, original, small)


def _student(args, original, the_plan, first, steps):
    """``(the model that trains, the GradualPruning that prunes it while it does, or None)``.

    ``--refit``: the plan's cut with the trained weights kept and every
    projection refit on ``first`` (``apply_plan(..., refit=True)``), trained as
    it is. Otherwise a second copy of the original, masked toward the plan.
    """
    by_hub = _by_hub(args, original, the_plan)  # the smaller model of a keras_hub task's classes
    if args.refit:
        apply = kp.hub.apply_plan if by_hub else kp.apply_plan
        return apply(original, the_plan, weights="keep", importance=args.importance, data=first,
                     refit=True), None
    gradual = args.epochs / 3 if args.gradual_epochs is None else args.gradual_epochs
    data = first if _criteria.criterion(args.importance).needs == "data" else None
    callback = kp.hub.GradualPruning if by_hub else kp.GradualPruning
    return _load_saved(args.model), callback(
        the_plan, end_step=round(gradual * steps), frequency=_trained.RECIPE["frequency"],
        shrink=args.shrink, schedule="final" if args.shrink else "cubic",
        importance=args.importance, data=data)


def _prune_plan(args, model):
    """The plan of ``--apply``, or one solved for the budget flags; a plan that grows is refused."""
    if args.apply:
        the_plan = _read(kp.Plan, "apply", args)
        grown = [v for v in the_plan.variables if v["new"] > v["width"]]
        if grown:
            raise ValueError(f"--apply {args.apply} grows {len(grown)} width(s) (e.g. {grown[0]['name']} "
                             f"from {grown[0]['width']} to {grown[0]['new']} channels), and "
                             "prune-trained only removes channels.")
        _check_against_plan(args, the_plan)  # --ignore, --residual, --attention: the plan's own
        try:  # a plan of another model, refused before training
            (kp.hub.apply_plan if _by_hub(args, model, the_plan) else kp.apply_plan)(model, the_plan)
        except kp.PlanMismatchError as err:
            raise ValueError(f"--apply {args.apply} does not fit {args.model}: {err}") from None
        return the_plan
    latency_model = _latency_model(args) if args.latency_model else None
    options = {**_budgets(args), "latency_model": latency_model, "ignore": _ignore(args),
               "residual": args.residual, "attention": args.attention}
    if _of_hub(args, model):  # as kp.hub plans it: the smaller model of the task's classes
        if "residual" not in args.typed:
            del options["residual"]  # the backbone's own (BERT: tie)
        return kp.hub.plan(model, homogeneous=args.homogeneous, **options)
    return kp.plan(model, **options)


def _by_hub(args, model, the_plan):
    """Whether prune-trained prunes ``model`` to ``the_plan`` as ``kp.hub`` does, into the task's
    classes: a keras_hub model and a plan ``kp.hub`` makes (homogeneous, or of the backbone); a
    plan of the task's whole graph per block (``kp.plan(task)``) gives a functional model."""
    return _of_hub(args, model) and (kp.hub.configures(the_plan) or the_plan.model_name != model.name)


# The library's keyword arguments that the command line passes on under the
# flag of the same name. Library errors keep the arguments they are about as
# fields (``kp.ArgumentError.arguments``); the command line shows these as the
# flag the user typed (``--flops 0``, ``--ignore lstm``, ``--variants 3``).
_FLAGS = (*_kinds.arguments(), "mode", "balance", "floor", "floor_on", "round_to",
          "min_channels", "ignore", "residual", "attention", "latency_model", "calibrate",
          "weights", "importance", "seed", "homogeneous", *_flags.TIMING)
# What decides the widths when a plan is solved; a plan given with --apply fixes
# them all. (--ignore, --residual and --attention are checked against the plan instead.)
_SOLVING = tuple(k for k in _FLAGS if k not in ("ignore", "residual", "attention", "weights",
                                                 "importance", "seed"))
# The command that fits a latency model, as error messages advise it.
_FIT_LATENCY = "`keras-precrop latency MODEL --json FILE`"
# Options that name a JSON file the command reads: what it holds, and how to get one.
_READS = {"apply": ("plan", "`keras-precrop precrop MODEL --plan FILE` writes one"),
          "latency_model": ("latency model", f"{_FIT_LATENCY} writes one, or leave "
                            "--latency_model out to measure one with the timing flags")}
def _flag(keyword, value):
    """``--keyword value`` as typed on the command line, from a Python value.

    A switch (True) and an empty value show the flag alone, a switch turned
    off (False) its ``--no-`` form; lists are comma-separated; argparse made
    0 into 0.0, which shows as 0.
    """
    from keras_precrop.errors import NAME_ONLY  # noqa: PLC0415  (NumPy: not for --help)

    if value is False:  # a BooleanOptionalAction's other half (--no-homogeneous, --no-distill)
        return f"--no-{keyword}"
    if isinstance(value, (list, tuple)):
        text = ",".join(map(str, value))
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = "" if value is True or value is None or value is NAME_ONLY else str(value)
    return f"--{keyword} {text}".rstrip()


def _error_line(err, args):
    """The error as the one line the command prints, naming what the user typed.

    An :class:`~keras_precrop.ArgumentError` names its arguments in fields:
    those that are flags of this command show as typed (``--flops 0``), others
    as keywords. A file that cannot be read or written is named by the option
    that gave it.
    """
    if isinstance(err, OSError) and err.filename is not None:
        for keyword, value in args.typed.items():
            if value == err.filename:
                return f"{_flag(keyword, value)}: {err.strerror}"
    if isinstance(err, kp.ArgumentError):  # its arguments that are flags here show as typed
        return err.format(lambda name, value: _flag(name, value) if name in vars(args)
                          else kp.errors.spelled(name, value), front="cli")
    return str(err)


def _typed(argv):
    """The options typed in ``argv``, with their values: a parse without defaults."""
    return vars(_flags.parser(defaults=False).parse_args(argv))


def main(argv=None):
    """Entry point of ``keras-precrop`` and ``python -m keras_precrop``.

    The arguments are parsed before anything imports Keras (``--help`` and
    argument errors answer at once); then Keras is imported without
    TensorFlow's start-up banners (see ``keras_precrop/_startup.py``).

    Returns:
        The exit status: 0 done, 1 an error (one line on stderr), 2 a command
        line at odds with itself (``--out`` naming the MODEL), as argparse's
        usage errors exit.
    """
    args = _flags.parser().parse_args(argv)
    args.typed = _typed(argv)
    _startup.quiet_command()
    try:
        _run(args)
    except (ValueError, TypeError, FileNotFoundError, OSError) as err:
        print(f"keras-precrop: error: {_error_line(err, args)}", file=sys.stderr)
        return 2 if isinstance(err, _UsageError) else 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
