"""Benchmark: SynExp solvers (``solve_densities``, ``solve_widths``) vs problem size.

Times, for 10 ... 10,000 layers (medians of wall-clock repeats):

* ``solve_densities(method="kkt")`` with a params budget, and with params and
  MACs budgets (both binding);
* ``solve_densities(method="slsqp")`` with both budgets, up to 1,000 layers
  (SLSQP's dense QP subproblem costs O(n^3) per iteration: beyond that it
  takes minutes);
* ``solve_widths`` on a synthetic MobileNet/EfficientNet-like width problem
  (inverted residual blocks with squeeze-excite, residual streams with
  reader/writer views and ``leq`` constraints; about one variable per conv
  layer and three bilinear terms per conv), params and MACs budgets, up to
  1,000 layers (also SLSQP).

Random costs are drawn per size from a fixed seed. OpenBLAS/OpenMP are set to
one thread before numpy loads: the problems are small, and on a shared
machine extra BLAS threads only add contention noise.

Usage::

    python benchmarks/bench_solver.py [--repeats 5]

Writes ``benchmarks/results/solver.json``, ``solver.md`` and ``solver.png``.
"""

import argparse
import json
import os
import pathlib
import platform
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import scipy  # noqa: E402

from keras_precrop.budget import WidthProblem, solve_densities, solve_widths  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SIZES = (10, 30, 100, 200, 300, 1000, 3000, 10000)
SLSQP_MAX = 1000
GOALS = (
    ("kkt_1", 100, 5e-3, "kkt <= 5 ms at 100 layers (one budget)"),
    ("kkt_2", 100, 5e-3, "kkt <= 5 ms at 100 layers (two budgets)"),
    ("kkt_1", 10000, 1.0, "kkt <= 1 s at 10,000 layers (one budget)"),
    ("kkt_2", 10000, 1.0, "kkt <= 1 s at 10,000 layers (two budgets)"),
    ("slsqp_2", 200, 1.0, "SLSQP < 1 s for 200 layers (two budgets)"),
    ("widths", 300, 1.0, "solve_widths < 1 s at 300 layers (241 variables, 480 terms)"),
)


def _densities_case(n, rng):
    """Per-layer params/MACs spanning 5 orders of magnitude, MACs/param varying 100x."""
    alpha = 10 ** rng.uniform(2, 7, n)
    beta = alpha * 10 ** rng.uniform(0, 2, n)
    return alpha, beta, 0.3 * alpha.sum(), 0.2 * beta.sum()


def synthetic_width_problem(n_layers, rng):
    """A MobileNetV2/EfficientNet-like WidthProblem with about ``n_layers`` convs.

    Each block: 1x1 expand (reads a view of the residual stream), depthwise
    3x3, squeeze-excite (two 1x1), 1x1 project (writes a view of the stream);
    BN after expand, depthwise and project. Every fourth block starts a new
    stage whose stream is created by that block's projection.
    """
    names, widths, lower = [], [], []
    coef, tvars, obj = [], [], []
    leq = []

    def var(name, width):
        names.append(name)
        widths.append(float(width))
        lower.append(np.log(min(8.0, width) / width))
        return len(names) - 1

    def term(params, macs, a, b=-1):
        coef.append((params, macs))
        tvars.append((a, b))

    def conv(a, b, k, pixels):
        ca, cb = widths[a], widths[b]
        term(k * ca * cb + cb, k * ca * cb * pixels, a, b)
        obj.extend((a, b))

    def bn(a):
        term(4 * widths[a], 0.0, a)

    pixels = 112 * 112
    stream = var("stem", 32)
    blocks = max(1, n_layers // 5)
    for i in range(blocks):
        new_stage = i % 4 == 0
        if new_stage:
            pixels = max(49, pixels // 2)
        c = widths[stream]
        out = float(rng.choice([16, 24, 40, 80, 112, 192, 320])) if new_stage else c
        reader = var(f"b{i}/read", c)
        leq.append((reader, stream))
        expand = var(f"b{i}/expand", 6 * c)
        conv(reader, expand, 1, pixels)
        bn(expand)
        term(9 * widths[expand], 9 * widths[expand] * pixels, expand)  # depthwise
        obj.append(expand)
        bn(expand)
        se = var(f"b{i}/se", max(4.0, c / 4))
        conv(expand, se, 1, 1)
        conv(se, expand, 1, 1)
        if new_stage:
            stream = var(f"stage{i}", out)
            conv(expand, stream, 1, pixels)
            bn(stream)
        else:
            writer = var(f"b{i}/write", c)
            leq.append((writer, stream))
            conv(expand, writer, 1, pixels)
            bn(writer)
    return WidthProblem(
        names=names, widths=np.array(widths), term_coef=np.array(coef),
        term_vars=np.array(tvars), const=np.array([1000.0, 0.0]),
        obj_var=np.array(obj), obj_weight=np.ones(len(obj)),
        leq=np.array(leq).reshape(-1, 2), lower=np.array(lower),
    )


def _median_time(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def run(repeats):
    """Time every solver at every size; returns the result rows."""
    rows = []
    for n in SIZES:
        rng = np.random.default_rng(n)
        alpha, beta, b_params, b_macs = _densities_case(n, rng)
        row = {"layers": n}
        t, res = _median_time(lambda: solve_densities(alpha, params_budget=b_params), repeats)
        row["kkt_1"] = t
        t, kkt = _median_time(lambda: solve_densities(
            alpha, beta, params_budget=b_params, flops_budget=b_macs), repeats)
        row["kkt_2"], row["kkt_2_active"] = t, kkt.active
        if n <= SLSQP_MAX:
            reps = repeats if n <= 300 else 1
            t, res = _median_time(lambda: solve_densities(
                alpha, beta, params_budget=b_params, flops_budget=b_macs, method="slsqp"), reps)
            row["slsqp_2"] = t
            row["slsqp_2_max_rel_diff"] = float(np.max(np.abs(res.densities / kkt.densities - 1)))
            row["slsqp_2_success"] = bool(res.success)
            problem = synthetic_width_problem(n, rng)
            p0, m0 = problem.cost(np.zeros(problem.num_variables))
            t, res = _median_time(lambda: solve_widths(
                problem, params_budget=0.3 * p0, flops_budget=0.4 * m0), reps)
            row["widths"] = t
            row["widths_variables"] = problem.num_variables
            row["widths_terms"] = len(problem.term_coef)
            row["widths_budget_rel_gap"] = float(max(
                abs(res.params / (0.3 * p0) - 1) if res.active["params"] else 0.0,
                abs(res.flops / (0.4 * m0) - 1) if res.active["flops"] else 0.0))
            row["widths_success"] = bool(res.success)
        rows.append(row)
        print(_table_line(row), flush=True)
    return rows


def _ms(value):
    return "skipped" if value is None else f"{value * 1e3:.2f}"


def _table_line(row):
    return (f"| {row['layers']:>6} | {_ms(row['kkt_1']):>9} | {_ms(row['kkt_2']):>9} "
            f"| {_ms(row.get('slsqp_2')):>10} | {_ms(row.get('widths')):>10} "
            f"| {row.get('widths_variables', '-'):>5} |")


TABLE_HEAD = ("| layers | kkt 1 budget (ms) | kkt 2 budgets (ms) | slsqp 2 budgets (ms) "
              "| solve_widths (ms) | width vars |\n|---:|---:|---:|---:|---:|---:|")


def _goals(rows):
    by_n = {row["layers"]: row for row in rows}
    lines = []
    for key, n, limit, text in GOALS:
        value = by_n[n][key]
        lines.append(f"- {text}: {value * 1e3:.2f} ms -> {'met' if value <= limit else 'NOT met'}")
    return lines


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for key, label in (("kkt_1", "kkt, 1 budget"), ("kkt_2", "kkt, 2 budgets"),
                       ("slsqp_2", "slsqp, 2 budgets"), ("widths", "solve_widths (SLSQP)")):
        pts = [(row["layers"], row[key]) for row in rows if row.get(key) is not None]
        ax.loglog(*zip(*pts), marker="o", label=label)
    ax.axhline(5e-3, color="gray", ls=":", lw=1)
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    ax.set_xlabel("layers")
    ax.set_ylabel("median time (s)")
    ax.set_title("keras_precrop.budget")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(TABLE_HEAD)
    rows = run(args.repeats)
    env = {"python": platform.python_version(), "numpy": np.__version__,
           "scipy": scipy.__version__, "machine": platform.machine(),
           "cpus": os.cpu_count(), "repeats": args.repeats, "blas_threads": 1}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "solver.json").write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    goals = _goals(rows)
    md = ["# SynExp solver timings", "",
          f"Median of {args.repeats} runs (1 run for SLSQP above 300 layers); "
          f"Python {env['python']}, numpy {env['numpy']}, scipy {env['scipy']}, "
          f"{env['cpus']} CPUs shared with other jobs (wall-clock times are pessimistic), "
          "BLAS single-threaded. "
          f"SLSQP and solve_widths are skipped above {SLSQP_MAX} layers (dense QP, O(n^3) "
          "per iteration).", "",
          TABLE_HEAD, *(_table_line(row) for row in rows), "",
          "Largest relative difference between slsqp and kkt densities: "
          f"{max(r['slsqp_2_max_rel_diff'] for r in rows if 'slsqp_2' in r):.2e}. "
          "Largest relative gap between a binding budget and the width solution's cost: "
          f"{max(r['widths_budget_rel_gap'] for r in rows if 'widths' in r):.2e}.", "",
          "## Goals", "", *goals, ""]
    (RESULTS / "solver.md").write_text("\n".join(md))
    _plot(rows, RESULTS / "solver.png")
    print("\n".join(goals))


if __name__ == "__main__":
    main()
