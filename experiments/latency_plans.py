"""Plans at equal *measured* time for grid ``uniform_latency`` (against uniform width scaling).

Fits a latency model of ResNet-20 on this machine (TensorFlow, batch 64
inference), then plans ``latency=`` budgets twice, with the library's default
mode and with ``mode="uniform"``, each calibrated (timed and re-planned until
it measures within the budget). The plans, the latency model and what each
plan measured are written under ``experiments/plans/``, where
``experiments/grids/uniform_latency.json`` trains them (``--method=precrop_plan``).

Run it on a quiet machine (pause training: ``kill -STOP -<pgid>`` with the
process group in ``experiments/runs/driver.pid``, then ``kill -CONT``)::

    python experiments/latency_plans.py --targets 0.5 0.33

Records are merged into ``<model>_tf_b<batch>_plans.json`` (a plan's name
replaces its earlier record). ``--latency_model`` plans with a committed
latency model instead of fitting a new one (the ``floor`` plan of grid
``latency_floor`` was planned with the one ``uniform_latency``'s plans used)::

    python experiments/latency_plans.py --targets 0.5 --modes floor \
        --latency_model experiments/plans/resnet20_tf_b64_latency_model.json

``streamfloor`` (grid ``latency_stream_floor``) floors the residual streams alone
(``floor=1.0, floor_on="streams"``).

``--model vit_cifar`` plans issue 61's CIFAR-10 ViT teacher (``experiments/vit_trained.py --plan``
trains them)::

    python experiments/latency_plans.py --model vit_cifar --targets 0.5
    python experiments/latency_plans.py --model vit_cifar --targets 0.5 --attention head_dims
"""

import argparse
import json
import pathlib
import platform

import keras_precrop as kp

HERE = pathlib.Path(__file__).resolve().parent
PLANS = HERE / "plans"


# Names of --modes that are exact mode with a floor at the uniform plan's widths (mode="auto" picks
# exact with a floor), on every width or on the residual streams alone; other names are modes.
FLOORS = {"floor": {"mode": "auto", "floor": 1.0},
          "streamfloor": {"mode": "auto", "floor": 1.0, "floor_on": "streams"}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.33])
    parser.add_argument("--modes", nargs="+", default=["auto", "uniform"],
                        help=f"plan modes, or {sorted(FLOORS)}: {FLOORS}")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--calibrate", type=int, default=3, help="calibration rounds per plan")
    parser.add_argument("--latency_model", type=pathlib.Path,
                        help="plan with this fitted latency model (JSON) instead of fitting one")
    parser.add_argument("--attention", choices=("heads", "head_dims"), default="heads",
                        help="what attention layers lose (kp.plan's attention=)")
    parser.add_argument("--out", type=pathlib.Path, default=PLANS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = _model(args.model)
    stem = f"{args.model}_tf_b{args.batch_size}" + ("_headdims" if args.attention == "head_dims" else "")
    if args.latency_model:
        lm = kp.LatencyModel.from_json(args.latency_model)
    else:
        lm = kp.latency_model(model, batch_size=args.batch_size, attention=args.attention)
        lm.to_json(args.out / f"{stem}_latency_model.json")
    lm.summary()
    path = args.out / f"{stem}_plans.json"
    record = json.loads(path.read_text()) if path.exists() else {
        "model": args.model, "batch_size": args.batch_size, "runtime": "tf", "plans": {}}
    record["machine"] = platform.processor() or platform.machine()
    for target in args.targets:
        for mode in args.modes:
            options = FLOORS.get(mode, {"mode": mode})
            plan = kp.plan(model, latency=target, latency_model=lm, calibrate=args.calibrate,
                           attention=args.attention, **options)
            name = f"{stem}_latency{target:g}_{mode}"
            plan.to_json(args.out / f"{name}.json")
            record["plans"][name] = plan_record(plan, target)
            print(f"{name}: measured {plan.solver['latency_calibration']['measured']:.3f} of the "
                  f"original's time, {plan.params:,} params, {plan.macs:,} MACs", flush=True)
    path.write_text(json.dumps(record, indent=1))


def _model(name):
    """A zoo model by name, or ``vit_cifar``: issue 61's CIFAR-10 ViT teacher (seed 0), whose plans
    ``vit_trained.py --plan`` prunes it to."""
    if name != "vit_cifar":
        return kp.models.get(name)
    import keras
    import keras_hub  # noqa: F401  (registers the teacher's classes for loading)

    return keras.models.load_model(HERE / "runs/vit_cifar-teacher-ep15-s0/final_model.keras",
                                   compile=False)


def plan_record(plan, target):
    """What the report reads of a calibrated latency plan: costs, mode, floor and what it measured."""
    return {"target": target, "mode": plan.mode, "params": plan.params, "macs": plan.macs,
            "params_ratio": plan.params / plan.original["params"],
            "macs_ratio": plan.macs / plan.original["macs"],
            "calibration": plan.solver["latency_calibration"],
            "uniform_ratio": plan.solver.get("uniform_ratio"),
            "floor_ratio": plan.solver.get("floor_ratio"), "floor_on": plan.solver.get("floor_on")}

if __name__ == "__main__":
    main()
