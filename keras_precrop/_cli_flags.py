"""The flags of the ``keras-precrop`` command line: its parser and the choices it offers.

Apart from :mod:`keras_precrop.cli`, which runs the commands, so that the
runners and the flags each stay one readable module. Like the command line
itself it imports nothing heavy: ``--help`` answers without Keras.
"""

from __future__ import annotations

import argparse

import keras_precrop as kp
from keras_precrop import _cli_trained as _trained
from keras_precrop.budget import kinds as _kinds
from keras_precrop.transfer import criteria as _criteria

# The choices the parser offers, spelled here so that --help imports no library module;
# tests/test_cli.py checks them against the library's own (MODES, FLOOR_ON, ...).
MODES = ("exact", "layerwise", "paper", "uniform")
FLOOR_ON = ("all", "streams")
ATTENTION = ("heads", "head_dims")
DEFAULT_MODES = ("exact", "layerwise", "uniform")
RUNTIMES = kp.latency.RUNTIMES  # the runtime table's names, read without loading Keras
# The channel rankings each command offers, read from the table (kp.register_importance adds to
# it) when the parser is built: precrop loads no data for those that need it; prune-trained gives
# them its first training examples, and ranks anew at each update (no chance).
IMPORTANCE = _criteria.Names("keras-precrop precrop/reconfigure")
GRADUAL_IMPORTANCE = _criteria.Names("keras-precrop prune-trained")


# The subcommands that plan widths, and their help.
PLANNERS = {"precrop": "prune channels to meet budgets (PreCrop)",
             "reconfigure": "re-distribute widths, layers may grow (PreConfig)"}
# The options of ``kp.latency_model`` that the timing flags of the same names give.
TIMING = ("batch_size", "runtime", "training", "variants", "rounds")
def parser(defaults=True):
    """The command line's parser.

    Args:
        defaults: False leaves every option without a default, so that a parse
            holds only the options the user typed (see :func:`_typed`).
    """
    parser = argparse.ArgumentParser(
        prog="keras-precrop",
        description="Structured pruning (PreCrop) and width reconfiguration (PreConfig) of "
        "Keras models, CNNs and transformers, at initialization or trained.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    default = (lambda value: value) if defaults else (lambda value: argparse.SUPPRESS)

    def add_parser(name, text):
        return sub.add_parser(name, help=text,
                              argument_default=None if defaults else argparse.SUPPRESS)

    add_parser("list", "list the zoo's model names")
    p = add_parser("latency", "time width variants of a model and fit a latency model")
    _model_args(p, default)
    _timing_args(p, default)
    p.add_argument("--json", help="write the latency model as JSON here")
    p = add_parser("profile", "print per-layer params, MACs and channel groups")
    _model_args(p, default)
    p.add_argument("--json", help="also write the profile as JSON to this file")
    _all_arg(p, "those without params or MACs")
    for name, text in PLANNERS.items():
        p = add_parser(name, text)
        _model_args(p, default)
        _planner_args(p, default)
    p = add_parser("compare", "plan the same budgets in several modes, uniform width scaling "
                   "included, side by side")
    _model_args(p, default)
    _budget_args(p, default)
    p.add_argument("--modes", default=default(",".join(DEFAULT_MODES)),
                   help="comma-separated modes to compare (default exact,layerwise,uniform)")
    p.add_argument("--measure", action="store_true",
                   help="also time every plan's model here, interleaved, and show speedups")
    p.add_argument("--json", help="also write the comparison as JSON to this file")
    p = add_parser("prune-trained", "prune a trained model gradually while it trains, distilled "
                   "from itself, and save it smaller")
    _prune_trained_args(p, default)
    return parser


def _all_arg(p, which):
    p.add_argument("--all", "--all_layers", dest="all_layers", action="store_true",
                   help=f"show every layer in the table, {which} too")


def _table_args(p):
    """How much of the plan's table is printed: the changed layers (default), all, or none."""
    group = p.add_mutually_exclusive_group()
    _all_arg(group, "unchanged ones")
    group.add_argument("--quiet", action="store_true",
                       help="print no per-layer plan table, only the plan's totals and what "
                       "was written (by default the table shows the layers the plan changes)")


def _model_args(p, default):
    """The model and how to walk it: every command but ``list`` takes them."""
    p.add_argument("model", nargs="?",
                   help="a zoo model name (see `keras-precrop list`) or a .keras file")
    p.add_argument("--model", dest="model_flag", metavar="MODEL", help="the same, as a flag")
    p.add_argument("--input_shape", help="input shape for zoo models, e.g. 64,64,3")
    p.add_argument("--num_classes", type=int, help="classes for zoo models")
    _walk_args(p, default)


def _walk_args(p, default):
    """How the model is walked: layers kept fixed, residual semantics, what attention loses."""
    p.add_argument("--ignore", default=default(""),
                   help="comma-separated layers whose channels stay fixed; 'auto' (alone or "
                   "among them) also keeps whole every layer the walk refuses, and the "
                   "profile or plan says which and why")
    p.add_argument("--residual", choices=("prefix", "tie"), default=default("prefix"),
                   help="residual-stream semantics (default: prefix)")
    p.add_argument("--attention", choices=ATTENTION, default=default("heads"),
                   help="attention layers lose whole heads (default) or narrow every head")


def _timing_args(p, default):
    """How a latency model times variants (``kp.latency_model``'s options)."""
    p.add_argument("--batch_size", type=int, default=default(32),
                   help="examples per timed call (default 32)")
    p.add_argument("--runtime", choices=RUNTIMES, default=default("tf"),
                   help="where to time (default tf: the Keras backend's own compiled step); "
                   "the guide's table of runtimes says what each runs and needs")
    p.add_argument("--training", action="store_true",
                   help="time a training step instead of inference")
    p.add_argument("--variants", type=int, default=default(20), help="models timed (default 20)")
    p.add_argument("--rounds", type=int, default=default(5),
                   help="interleaved rounds (default 5)")


def _budget_args(p, default):
    """Budgets (``budget.kinds``' flags), their latency model and the width grid: what a plan is
    solved under."""
    for kind in _kinds.KINDS:
        p.add_argument(f"--{kind.ratio}", type=float, help=kind.help)
    for kind in _kinds.KINDS:
        if kind.absolute:
            p.add_argument(f"--{kind.absolute}", type=float, help=kind.absolute_help)
    p.add_argument("--latency_model", help="a latency model JSON (`keras-precrop latency`); "
                   "without it one is measured now with the timing flags below")
    _timing_args(p, default)
    p.add_argument("--calibrate", type=int,
                   help="rounds of timing the plan and re-planning until it measures <= "
                   "--latency (default: 2 when the latency model is measured now, else 0)")
    p.add_argument("--round_to", type=int, default=default(1), help="channel multiple, e.g. 8")
    p.add_argument("--min_channels", type=int, default=default(1))


def _planner_args(p, default):
    """Budgets, the mode and the outputs of ``precrop``/``reconfigure``."""
    _budget_args(p, default)
    p.add_argument("--mode", choices=("auto", *MODES), default=default("auto"),
                   help="width translation (default auto: layerwise for reconfigure and for "
                   "a FLOPs budget; exact with the residual streams floored at uniform's widths "
                   "for a latency budget; exact otherwise; uniform: one width factor for all layers)")
    p.add_argument("--balance", type=float,
                   help="exact mode: adjacent width ratios at most this factor apart, e.g. 2")
    p.add_argument("--floor", type=float,
                   help="exact mode: no width below this ratio (0-1] of --mode uniform's widths at "
                   "the same budgets, e.g. 1.0")
    p.add_argument("--floor_on", choices=FLOOR_ON,
                   help="which widths --floor holds: all (default) or the residual streams alone")
    p.add_argument("--out", help="save the rebuilt model here (a .keras file)")
    p.add_argument("--plan", help="write the plan as JSON here")
    p.add_argument("--apply", help="apply this plan JSON instead of solving")
    p.add_argument("--weights", choices=("keep", "fresh"),
                   help="the weights of the model --out saves: keep (the default for a MODEL.keras "
                   "file: each width keeps its most important channels with their trained weights, "
                   "to fine-tune) or fresh (the default for a zoo model: newly initialized, as "
                   "PreCrop prescribes)")
    p.add_argument("--importance", choices=IMPORTANCE,
                   help=_importance_help(IMPORTANCE, "--weights keep: how channels are ranked "
                                         "(default l1): ") + _needing_data())
    p.add_argument("--seed", type=int,
                   help="an integer fixes the new model's fresh weights and --importance random "
                   "(default: drawn anew each run)")
    p.add_argument("--homogeneous", action=argparse.BooleanOptionalAction,
                   help="a keras_hub task or backbone MODEL.keras is pruned as kp.hub.precrop does: "
                   "its backbone, the budgets ratios of the backbone's, and --out saves the same "
                   "keras_hub classes. --homogeneous: the same widths in every block, a new config "
                   "of the backbone's own class, budgets of the whole task (the default for a task "
                   "whose backbone's config can say widths: ViT, DeiT, BERT); --no-homogeneous "
                   "(the default for a bare backbone): per-block widths, the backbone a "
                   "functional kp.hub.PrunedBackbone")
    _table_args(p)


def _importance_help(choices, lead, data_from=None):
    """``--importance``'s help: what each ranking of ``choices`` ranks by, from the table."""
    parts = []
    for name in choices:
        ranking = _criteria.criterion(name)
        where = f" ({data_from})" if data_from and ranking.needs == "data" else ""
        parts.append(f"{name}: {ranking.summary}{where}" if ranking.summary else name)
    return (lead + "; ".join(parts) + ".").replace("%", "%%")  # argparse formats help with %


def _needing_data():
    """The help's word on the rankings that need training data, which precrop does not load."""
    data = [name for name in _criteria.Names(needs=["data"]) if name not in IMPORTANCE]
    if not data:
        return ""
    return (f" {', '.join(data)} need{'s' if len(data) == 1 else ''} training data, which only the "
            f"Python API takes: kp.precrop(model, ..., weights='keep', importance={data[0]!r}, "
            "data=(x, y))").replace("%", "%%")


def _prune_trained_args(p, default):
    """The flags of ``prune-trained``: the widths, the data and the training recipe."""
    p.add_argument("model", metavar="MODEL.keras", help="the trained model, a .keras file")
    for kind in _kinds.KINDS:  # the ratios: what the trained model's budgets are of
        p.add_argument(f"--{kind.ratio}", type=float, help=kind.help + (
            " (measured here unless --latency_model is given)" if kind.timed else ""))
    p.add_argument("--latency_model", help="a latency model JSON (`keras-precrop latency`)")
    p.add_argument("--apply", metavar="PLAN", help="prune to this plan JSON's widths instead of a "
                   "budget (`keras-precrop precrop MODEL --plan FILE` writes one)")
    p.add_argument("--data", required=True, metavar="SPEC",
                   help="cifar10 (TensorFlow Datasets), or a .npz file with arrays x_train, y_train "
                   "and optionally x_test, y_test (a test accuracy is printed when present)")
    p.add_argument("--data_dir", help="--data cifar10: the TFDS data directory (default: TFDS' own)")
    p.add_argument("--split", help="--data cifar10: the TFDS split to train on, a slice of train to "
                   "try the command on first, e.g. train[:10%%] (5,000 images) or train[:2000] "
                   "(default: train, all 50,000); the test accuracy is still on the whole test split")
    p.add_argument("--epochs", type=int, required=True, help="epochs of training in all (0 with "
                   "--refit: the cut refit model, untrained)")
    p.add_argument("--gradual_epochs", type=float,
                   help="epochs over which the channels go, on a cubic schedule; the rest of "
                   "--epochs trains the pruned model, rebuilt smaller from the next whole epoch "
                   "on (its optimizer's state carried over) (default: a third of --epochs)")
    p.add_argument("--shrink", type=float, default=default(0.0),
                   help="fade the channels the plan leaves out (re-ranked as they go) by 1 - SHRINK "
                   "after every step, then take them away at once when --gradual_epochs ends "
                   "(kp.GradualPruning(shrink=, schedule='final'); e.g. 0.01 for 390 steps); "
                   "default 0: they go a few at a time on a cubic schedule")
    p.add_argument("--importance", choices=GRADUAL_IMPORTANCE, default=default("l1"),
                   help=_importance_help(GRADUAL_IMPORTANCE, "how the channels are ranked, anew at "
                                         "each update (once with --refit; default l1): ",
                                         f"here the first {_trained.TAYLOR_EXAMPLES} training examples"))
    p.add_argument("--refit", action="store_true", default=default(False),
                   help="cut at once before training, keeping the weights --importance ranks first, "
                   f"and refit every linear projection (Dense, attention's) by least squares to the "
                   f"original's outputs on the first {_trained.TAYLOR_EXAMPLES} training examples "
                   "(kp.apply_plan(..., refit=True); a projection they cannot determine keeps its "
                   "weights, named in a RefitWarning); then train --epochs on the smaller model "
                   "(--epochs 0: none)")
    p.add_argument("--distill", action=argparse.BooleanOptionalAction, default=default(True),
                   help="train against the original model's outputs too (distillation; default) "
                   "or on the labels alone (--no-distill)")
    p.add_argument("--learning_rate", type=float, default=default(_trained.RECIPE["learning_rate"]),
                   help="SGD's starting rate (momentum 0.9, L2 1e-4), decayed linearly to 0: the "
                   "training recipe's peak, rewound (default 0.1)")
    p.add_argument("--batch_size", type=int, default=default(_trained.RECIPE["batch_size"]),
                   help="training batch size (default 128)")
    p.add_argument("--out", required=True, help="save the pruned model here (a .keras file)")
    p.add_argument("--homogeneous", action=argparse.BooleanOptionalAction,
                   help="a keras_hub task MODEL.keras is pruned as kp.hub.GradualPruning does, and "
                   "--out saves the same keras_hub classes. --homogeneous: the same widths in every "
                   "block, a new config (the default where the backbone's config can say widths: "
                   "ViT, DeiT, BERT); --no-homogeneous (the default for other tasks): per-block "
                   "widths, the backbone a kp.hub.PrunedBackbone inside the task, its budgets "
                   "ratios of the backbone's")
    _walk_args(p, default)
    _table_args(p)
