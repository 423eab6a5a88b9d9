"""Figure 7: the paper's ImageNet tables by counts (no training, no ImageNet needed).

For ResNet-34 (torchvision layout), MobileNetV2 and EfficientNetB0
(``keras.applications``, 224x224, ``weights=None``) this library's PreCrop
(the FLOPs ratio of the paper's Table "Comparison of PreCrop with SynFlow on
ImageNet", alone and together with the params ratio the paper reports) and
PreConfig (params and FLOPs ratios of the paper's PreConfig table)
are planned and rebuilt, and their parameters and MACs (``count_params()`` of
the rebuilt model, ``profile`` MACs; the paper's "FLOPs (G)" are
multiply-accumulates) are set beside the paper's values. Every row runs in
``exact``, ``layerwise`` and balanced exact (``balance=2``) modes, with the
plan's SynExp objective and largest adjacent-width factor (``balance_max``).

Writes ``experiments/results/imagenet_counts.json``; ``report.py`` renders it.

Usage::

    python experiments/imagenet_counts.py
"""

import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras_precrop as kp  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "results" / "imagenet_counts.json"

# (zoo model, method, budgets as ratios, the paper's (GMACs, M params) for that row).
# PreCrop rows run twice: at the paper's FLOPs ratio alone, and at its realized
# params and FLOPs ratios together; PreConfig rows at its params and FLOPs ratios.
_PAPER = (
    ("resnet34", "baseline", None, None, (3.64, 21.80)),
    ("resnet34", "precrop", 11.09 / 21.80, 0.750, (2.73, 11.09)),
    ("resnet34", "preconfig", 16.52 / 21.80, 1.0, (3.64, 16.52)),
    ("mobilenet_v2", "baseline", None, None, (0.33, 3.51)),
    ("mobilenet_v2", "precrop", 2.33 / 3.51, 0.788, (0.26, 2.33)),
    ("mobilenet_v2", "precrop", 1.85 / 3.51, 0.636, (0.21, 1.85)),
    ("mobilenet_v2", "preconfig", 2.83 / 3.51, 0.97, (0.32, 2.83)),
    ("efficientnet_b0", "baseline", None, None, (0.40, 5.29)),
    ("efficientnet_b0", "precrop", 3.67 / 5.29, 0.750, (0.30, 3.67)),
    ("efficientnet_b0", "preconfig", 4.29 / 5.29, 1.0, (0.40, 4.29)),
)


def _rows():
    """``(model, method, budgets, paper)`` for every row of the table."""
    for name, method, params, flops, paper in _PAPER:
        if method == "baseline":
            yield name, method, {}, paper
            continue
        if method == "precrop":
            yield name, method, {"flops": flops}, paper
        yield name, method, {"params": round(params, 4), "flops": flops}, paper


# Translation modes: their name in the table and their plan options.
_MODES = {"exact": {"mode": "exact"}, "layerwise": {"mode": "layerwise"},
          "exact, balance 2": {"mode": "exact", "balance": 2}}


def _row(model, method, budgets, mode):
    start = time.perf_counter()
    if method == "precrop":
        built = kp.precrop(model, **_MODES[mode], **budgets)
    elif method == "preconfig":
        built = kp.reconfigure(model, **_MODES[mode], **budgets)
    else:
        built = model
    seconds = time.perf_counter() - start
    solver = built.precrop_plan.solver if method != "baseline" else {}
    return {
        "mode": mode,
        "params": built.count_params(),
        "macs": kp.profile(built).total_macs,
        "objective": solver.get("objective"),
        "balance_max": solver.get("balance_max"),
        "seconds": round(seconds, 2),
    }


def main():
    rows, models = [], {}
    for name, method, budgets, paper in _rows():
        if name not in models:
            models[name] = kp.models.get(name)
        model = models[name]
        modes = tuple(_MODES) if method != "baseline" else (None,)
        for mode in modes:
            row = {"model": name, "method": method, "budgets": budgets, **_row(model, method, budgets, mode)}
            row["paper_gmacs"], row["paper_mparams"] = paper
            rows.append(row)
            print(
                f"{name:16s} {method:9s} {mode or '':9s} {budgets}: {row['params'] / 1e6:.2f}M params "
                f"(paper {paper[1]}M), {row['macs'] / 1e9:.3f} GMACs (paper {paper[0]})",
                flush=True,
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
