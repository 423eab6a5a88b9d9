"""CPU throughput of PreCrop at 50% MACs across translation modes.

Compares ``mode`` (exact / layerwise), ``residual`` (prefix / tie) and
``round_to`` (1 / 8) for resnet20 and mobilenet_v2_cifar: batch-64 compiled
inference, interleaved rounds, speedup = median over rounds of baseline time
over variant time. Writes benchmarks/results/modes.json and modes.md.

Usage: python benchmarks/bench_modes.py [--repeats 7]
"""

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras_precrop as kp  # noqa: E402
from _timing import forward, interleaved, machine_info  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _variants(base):
    variants = {"baseline": base}
    for mode in ("exact", "layerwise"):
        for residual in ("prefix", "tie"):
            for round_to in (1, 8):
                variants[f"{mode}/{residual}/r{round_to}"] = kp.precrop(
                    base, flops=0.5, mode=mode, residual=residual, round_to=round_to)
    return variants


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for name in ("resnet20", "mobilenet_v2_cifar"):
        base = kp.models.get(name)
        original = kp.profile(base)
        variants = _variants(base)
        times = interleaved({k: forward(m, 64) for k, m in variants.items()}, repeats=args.repeats)
        for key, model in variants.items():
            prof = kp.profile(model)
            speedup = statistics.median(b / v for b, v in zip(times["baseline"], times[key]))
            rows.append({"model": name, "variant": key,
                         "params_ratio": prof.total_params / original.total_params,
                         "macs_ratio": prof.total_macs / original.total_macs,
                         "throughput_speedup": speedup,
                         "seconds_per_batch": statistics.median(times[key])})
            print(f"{name:20s} {key:22s} MACs {rows[-1]['macs_ratio']:.3f} "
                  f"speedup {speedup:.2f}x", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "modes.json"), "w") as f:
        json.dump({"machine": machine_info(), "repeats": args.repeats, "rows": rows}, f, indent=1)
    lines = ["# PreCrop at 50% MACs: CPU throughput by translation mode", "",
             "Batch-64 compiled inference, interleaved rounds, median speedup vs. the baseline "
             f"({args.repeats} rounds). Command: `python benchmarks/bench_modes.py`.", "",
             "| model | mode/residual/round_to | params | MACs | throughput speedup |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['variant']} | {r['params_ratio']:.3f} | {r['macs_ratio']:.3f} | "
              f"{r['throughput_speedup']:.2f}x |" for r in rows]
    with open(os.path.join(RESULTS, "modes.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
