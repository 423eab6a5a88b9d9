"""Layer-wise densities SynFlow gives on the zoo ResNet-20 at four overall densities.

Prunes a freshly initialized ``keras_precrop.models.get("resnet20")`` with
SynFlow (100 rounds, exponential schedule, the Synaptic-Flow defaults) to
densities 10^-0.5, 10^-1, 10^-1.5 and 10^-2 and writes each prunable weight's
kept fraction to ``examples/results/synflow_resnet20_densities.json``, to be
compared with the SynExp solution. Takes a few seconds per density on a
2-core CPU.

Usage::

    python examples/synflow_densities.py [--seed 0] [--iterations 100] [--out PATH]
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

from keras_precrop import models, pai  # noqa: E402

EXPONENTS = (0.5, 1.0, 1.5, 2.0)
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results" / "synflow_resnet20_densities.json"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="keras.utils.set_random_seed before building")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    keras.utils.set_random_seed(args.seed)
    model = models.get("resnet20")
    sizes = {path: int(v.shape.num_elements()) for path, v in pai.prunable_weights(model).items()}
    runs = []
    for exponent in EXPONENTS:
        density = 10.0**-exponent
        start = time.perf_counter()
        masks = pai.synflow(model, density, iterations=args.iterations, verbose=0)
        seconds = time.perf_counter() - start
        kept = int(sum(m.sum() for m in masks.values()))
        runs.append(
            {
                "log10_density": -exponent,
                "density": density,
                "kept": kept,
                "seconds": round(seconds, 2),
                "layer_densities": pai.layer_densities(masks),
            }
        )
        print(f"density 10^-{exponent}: kept {kept:,} of {sum(sizes.values()):,} in {seconds:.1f}s")
        print(pai.sparsity_report(masks))
    result = {
        "model": "resnet20",
        "seed": args.seed,
        "pruner": "keras_precrop.pai.synflow",
        "iterations": args.iterations,
        "schedule": "exponential",
        "scope": "global",
        "layer_sizes": sizes,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
