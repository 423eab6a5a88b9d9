"""Figure 1 (spar_comp): SynExp's layer densities vs this library's SynFlow, no training.

For ResNet-20 and MobileNetV2-CIFAR at overall densities 10^-x,
x in {0.25, 0.5, 1, 1.5, 2}:

* **SynFlow**: ``pai.synflow`` (100 rounds, exponential schedule, global
  scope) on a freshly initialized model; the kept fraction of each prunable
  kernel.
* **SynExp**: the paper's density program over the same kernels,
  ``maximize sum_l log p_l`` s.t. ``sum_l n_l p_l <= 10^-x * sum_l n_l``,
  ``p_l <= 1`` (``solve_densities``, alpha = kernel sizes ``n_l``).

Reports, per model and x, the largest absolute density difference and the
Pearson correlation of the log densities, and writes
``experiments/results/spar_comp.json`` (``report.py`` draws the figure).

Usage::

    python experiments/spar_comp.py [--seed 0] [--iterations 100]
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_precrop as kp  # noqa: E402
from keras_precrop import pai  # noqa: E402

EXPONENTS = (0.25, 0.5, 1.0, 1.5, 2.0)
MODELS = ("resnet20", "mobilenet_v2_cifar")
OUT = pathlib.Path(__file__).resolve().parent / "results" / "spar_comp.json"


def compare(model, density, iterations):
    """One model at one density: per-kernel SynFlow and SynExp densities and their agreement."""
    sizes = {path: int(np.prod(v.shape)) for path, v in pai.prunable_weights(model).items()}
    start = time.perf_counter()
    synflow = pai.layer_densities(pai.synflow(model, density, iterations=iterations, verbose=0))
    seconds = time.perf_counter() - start
    alpha = np.array(list(sizes.values()), dtype=np.float64)
    solved = kp.solve_densities(alpha, params_budget=density * alpha.sum()).densities
    ours = np.array([synflow[path] for path in sizes])
    floor = 1.0 / alpha  # a layer SynFlow empties is compared at "one weight kept"
    log_ours, log_solved = np.log(np.maximum(ours, floor)), np.log(solved)
    return {
        "density": density,
        "layers": list(sizes),
        "sizes": list(sizes.values()),
        "synflow": ours.tolist(),
        "synexp": solved.tolist(),
        "max_abs_diff": float(np.max(np.abs(ours - solved))),
        "r_log_density": float(np.corrcoef(log_ours, log_solved)[0, 1]),
        "emptied_by_synflow": [path for path, d in zip(sizes, ours) if d == 0],
        "synflow_seconds": round(seconds, 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    results = {"seed": args.seed, "iterations": args.iterations, "models": {}}
    for name in MODELS:
        keras.utils.set_random_seed(args.seed)
        model = kp.models.get(name)
        rows = []
        for exponent in EXPONENTS:
            row = {"x": exponent, **compare(model, 10.0**-exponent, args.iterations)}
            rows.append(row)
            print(
                f"{name:20s} 10^-{exponent:<4}: max |diff| {row['max_abs_diff']:.4f}, "
                f"r(log density) {row['r_log_density']:.4f}, SynFlow {row['synflow_seconds']} s",
                flush=True,
            )
        results["models"][name] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
