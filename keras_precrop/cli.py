"""The ``keras-precrop`` command line: profile, precrop and reconfigure.

Examples::

    keras-precrop profile resnet20
    keras-precrop precrop resnet20 --params 0.3 --out small.keras
    keras-precrop reconfigure efficientnet_b0 --params 0.8 --flops 1.0 --plan plan.json
    keras-precrop precrop model.keras --apply plan.json --out small.keras
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys

import keras

import keras_precrop as kp


def _parser():
    parser = argparse.ArgumentParser(
        prog="keras-precrop",
        description="Structured pruning-at-initialization (PreCrop) and width "
        "reconfiguration (PreConfig) of Keras CNNs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p):
        p.add_argument("model", nargs="?",
                       help="a zoo model name (see `keras-precrop list`) or a .keras file")
        p.add_argument("--model", dest="model_flag", metavar="MODEL",
                       help="the same, as a flag")
        p.add_argument("--input_shape", help="input shape for zoo models, e.g. 64,64,3")
        p.add_argument("--num_classes", type=int, help="classes for zoo models")
        p.add_argument("--ignore", default="", help="comma-separated layers whose channels stay fixed")
        p.add_argument("--residual", choices=("prefix", "tie"), default="prefix",
                       help="residual-stream semantics (default: prefix)")

    sub.add_parser("list", help="list the zoo's model names")
    p = sub.add_parser("profile", help="print per-layer params, MACs and channel groups")
    model_args(p)
    p.add_argument("--json", help="also write the profile as JSON to this file")
    for name, text in (("precrop", "prune channels to meet budgets (PreCrop)"),
                       ("reconfigure", "re-distribute widths, layers may grow (PreConfig)")):
        p = sub.add_parser(name, help=text)
        model_args(p)
        p.add_argument("--params", type=float, help="parameter budget, ratio of the original")
        p.add_argument("--flops", type=float, help="FLOP budget, ratio of the original")
        p.add_argument("--max_params", type=float, help="absolute parameter budget")
        p.add_argument("--max_macs", type=float, help="absolute MAC budget")
        p.add_argument("--mode", choices=("exact", "layerwise", "paper"),
                       help="width translation (default: exact for precrop, "
                       "layerwise for reconfigure)")
        p.add_argument("--round_to", type=int, default=1, help="channel multiple, e.g. 8")
        p.add_argument("--min_channels", type=int, default=1)
        p.add_argument("--out", help="save the rebuilt model here (.keras)")
        p.add_argument("--plan", help="write the plan as JSON here")
        p.add_argument("--apply", help="apply this plan JSON instead of solving")
        p.add_argument("--all", "--all_layers", dest="all_layers", action="store_true",
                       help="show every layer in the table, unchanged ones too")
    return parser


def _load_model(args):
    if (args.model is None) == (args.model_flag is None):
        raise ValueError("give the model once: `keras-precrop CMD resnet20` or `--model resnet20`")
    args.model = args.model or args.model_flag
    if args.model.endswith(".keras") or os.path.exists(args.model):
        if not os.path.exists(args.model):
            raise FileNotFoundError(f"no such model file: {args.model}")
        return keras.models.load_model(args.model, compile=False)
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


def _run(args):
    if args.command == "list":
        print("\n".join(kp.models.list()))
        return
    model = _load_model(args)
    if args.command == "profile":
        prof = kp.profile(model, ignore=_ignore(args), residual=args.residual)
        prof.summary()
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(prof.to_json(indent=1))
        return
    if args.apply:
        the_plan = kp.Plan.from_json(args.apply)
    else:
        the_plan = kp.plan(
            model, args.params, args.flops, max_params=args.max_params,
            max_macs=args.max_macs, round_to=args.round_to,
            mode=args.mode or ("exact" if args.command == "precrop" else "layerwise"),
            min_channels=args.min_channels, ignore=_ignore(args), residual=args.residual,
            upper=1.0 if args.command == "precrop" else None,
        )
    the_plan.summary(only_changed=not args.all_layers, show_all_hint="--all")
    if args.plan:
        the_plan.to_json(args.plan)
        print(f"Plan written to {args.plan}")
    if args.out:
        new = kp.apply_plan(model, the_plan)
        new.save(args.out)
        print(f"Model written to {args.out} ({new.count_params():,} params)")


# The library's keyword arguments that the command line passes on under the
# flag of the same name. Library errors name an argument as the keyword and its
# Python value (``flops=0``, ``ignore=['lstm']``); the command line shows them
# as the flag the user typed (``--flops 0``, ``--ignore lstm``).
_FLAGS = ("params", "flops", "max_params", "max_macs", "mode", "round_to",
          "min_channels", "ignore", "residual")
_KEYWORD_VALUE = re.compile(
    r"(?<![\w.-])(" + "|".join(_FLAGS) + r")="
    r"(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|[-+]?(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)|)")


def _flag_value(literal):
    """A Python literal from a library message, as typed on the command line."""
    if not literal:
        return ""
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):  # nan, inf
        return literal
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # argparse made 0 into 0.0
    return str(value)


def _in_flags(message):
    """Rewrite a library message's ``keyword=value`` arguments as ``--flag value``."""
    def flag(match):
        value = _flag_value(match.group(2))
        return f"--{match.group(1)}" + (f" {value}" if value else "")

    return _KEYWORD_VALUE.sub(flag, message)


def main(argv=None):
    """Entry point of ``keras-precrop`` and ``python -m keras_precrop``.

    Both import the package first, which keeps TensorFlow's start-up banners
    off stderr (see ``keras_precrop/_startup.py``).
    """
    args = _parser().parse_args(argv)
    try:
        _run(args)
    except (ValueError, TypeError, FileNotFoundError, OSError) as err:
        print(f"keras-precrop: error: {_in_flags(str(err))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
