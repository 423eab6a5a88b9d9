"""Benchmark: ``keras_precrop.profile`` on keras.applications models.

For each model, times building it (``weights=None``) and profiling the built
model (walk, channel groups, cost model), and reports the median and the
fastest of several repeats. Goal (issue 2): ``profile(EfficientNetB0)`` runs in
under a second.

Usage::

    python benchmarks/bench_profile.py [--repeats 20] [--build-repeats 3]

Writes ``benchmarks/results/profile.json`` and ``profile.md``.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_precrop as kp  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = ("EfficientNetB0", "MobileNetV2", "ResNet50", "DenseNet121", "Xception")
GOAL_S = 1.0  # profile(EfficientNetB0)


def _timed(fn, repeats):
    """Runs ``fn`` ``repeats`` times; returns (seconds per run, last result)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def _bench(name, repeats, build_repeats):
    application = getattr(keras.applications, name)

    def build():
        keras.backend.clear_session()
        return application(weights=None)

    build_times, model = _timed(build, build_repeats)
    profile_times, prof = _timed(lambda: kp.profile(model), repeats)
    return {
        "model": name,
        "input_shape": list(model.inputs[0].shape[1:]),
        "layers": len(prof.layers),
        "width_variables": len(prof.variables),
        "params": prof.total_params,
        "macs": prof.total_macs,
        "params_match_count_params": prof.total_params == model.count_params(),
        "build_median_s": statistics.median(build_times),
        "profile_first_s": profile_times[0],
        "profile_median_s": statistics.median(profile_times),
        "profile_min_s": min(profile_times),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="profile() calls per model")
    parser.add_argument("--build-repeats", type=int, default=3, help="builds per model")
    args = parser.parse_args()

    rows = [_bench(name, args.repeats, args.build_repeats) for name in MODELS]
    effnet = rows[0]["profile_median_s"]
    result = {
        "what": "keras_precrop.profile(model) on a built keras.applications model (weights=None)",
        "units": "seconds (wall clock); MACs per example at the default input size",
        "repeats": args.repeats,
        "build_repeats": args.build_repeats,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                     "keras_precrop": kp.__version__},
        "goal": f"profile(EfficientNetB0) median < {GOAL_S} s",
        "goal_met": effnet < GOAL_S,
        "models": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# profile() on keras.applications models",
        "",
        f"Machine: {result['machine']}; versions {result['versions']}. Build: median of "
        f"{args.build_repeats}; profile: median, fastest and first of {args.repeats} calls on "
        "the built model.",
        "",
        "| model | input | layers | width variables | params | MACs | build s | "
        "profile s (median) | profile s (min) | profile s (first) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['input_shape']))} | {r['layers']} | "
            f"{r['width_variables']} | {r['params']:,} | {r['macs']:,} | "
            f"{r['build_median_s']:.2f} | {r['profile_median_s']:.4f} | "
            f"{r['profile_min_s']:.4f} | {r['profile_first_s']:.4f} |"
        )
    lines += ["", f"Goal {result['goal']}: {'met' if result['goal_met'] else 'NOT met'} "
              f"({effnet * 1000:.1f} ms)."]
    (RESULTS / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
