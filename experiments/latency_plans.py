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
"""

import argparse
import json
import pathlib
import platform

import keras_precrop as kp

HERE = pathlib.Path(__file__).resolve().parent
PLANS = HERE / "plans"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.33])
    parser.add_argument("--modes", nargs="+", default=["auto", "uniform"])
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--calibrate", type=int, default=3, help="calibration rounds per plan")
    parser.add_argument("--out", type=pathlib.Path, default=PLANS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = kp.models.get(args.model)
    lm = kp.latency_model(model, batch_size=args.batch_size)
    lm.summary()
    stem = f"{args.model}_tf_b{args.batch_size}"
    lm.to_json(args.out / f"{stem}_latency_model.json")
    record = {"model": args.model, "batch_size": args.batch_size, "runtime": "tf",
              "machine": platform.processor() or platform.machine(), "plans": {}}
    for target in args.targets:
        for mode in args.modes:
            plan = kp.plan(model, latency=target, latency_model=lm, mode=mode,
                           calibrate=args.calibrate)
            name = f"{stem}_latency{target:g}_{mode}"
            plan.to_json(args.out / f"{name}.json")
            record["plans"][name] = {
                "target": target, "mode": plan.mode, "params": plan.params, "macs": plan.macs,
                "params_ratio": plan.params / plan.original["params"],
                "macs_ratio": plan.macs / plan.original["macs"],
                "calibration": plan.solver["latency_calibration"],
                "uniform_ratio": plan.solver.get("uniform_ratio")}
            print(f"{name}: measured {plan.solver['latency_calibration']['measured']:.3f} of the "
                  f"original's time, {plan.params:,} params, {plan.macs:,} MACs", flush=True)
    (args.out / f"{stem}_plans.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
