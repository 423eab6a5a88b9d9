"""Benchmark reports with a latency model whose held-out error is ``None`` (issue 42).

A latency model fitted with fewer than 3 held-out variants reports no
held-out error; the benchmark reports print "n/a" for it instead of crashing
on a format of ``None``.
"""

import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_latency  # noqa: E402

import _timing  # noqa: E402

_NO_ERROR = {"median": None, "worst": None, "train_median": 0.02, "train_worst": 0.05,
             "plans_median": None, "plans_worst": None}


def test_a_missing_held_out_error_prints_as_not_available():
    assert _timing.share(None) == "n/a"
    assert _timing.share(0.125) == "12.5%"
    assert bench_latency._error_cell(_NO_ERROR).startswith("n/a")
    assert bench_latency._error_cell({**_NO_ERROR, "median": 0.01, "worst": 0.02}) == \
        "1.0% / 2.0% (met)"
    study = {"what": "tf", "batch": 8, "backend": "tensorflow", "device": "CPU",
             "infeasible": "too small", "latency_model": {
                 "block": "conv", "ridge": 0.1, "fit_seconds": 3.0, "error": _NO_ERROR,
                 "refinement_plans": 0, "variants": [1, 2, 3]}}
    text = "\n".join(bench_latency._study_lines("resnet20", study))
    assert "median n/a, worst n/a (on fitted ones 2.0% / 5.0%" in text
