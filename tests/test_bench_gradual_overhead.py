"""``benchmarks/bench_gradual_overhead.py``: what it measures is what its table says.

The smoke run (``--quick``) trains two copies of a zoo model a few steps
each, one with a ``GradualPruning`` under way; the test checks that mask
updates were timed in the measured epoch, that the overhead printed is the
median same-round ratio of the recorded seconds, and that ``--quick`` writes
outside the repository (a smoke run must not look like evidence).
"""

import json
import pathlib
import statistics
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_gradual_overhead as bench  # noqa: E402


def _status():
    return subprocess.run(["git", "status", "--porcelain", "benchmarks"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_the_quick_run_times_a_pruning_fit_against_a_plain_one(capsys):
    before = _status()
    bench.main(["--quick", "--frequency", "2"])
    folder = pathlib.Path(capsys.readouterr().err.split("written to ")[-1].strip())
    assert REPO not in folder.parents and _status() == before
    result = json.loads((folder / "gradual_overhead.json").read_text())
    seconds = result["seconds"]
    assert len(seconds["plain"]) == len(seconds["gradual"]) == result["rounds"] == 1
    ratio = statistics.median(g / p for g, p in zip(seconds["gradual"], seconds["plain"]))
    fastest = min(seconds["gradual"]) / min(seconds["plain"])
    assert result["overhead"] == pytest.approx({"median same-round ratio": ratio - 1,
                                                "ratio of the medians": ratio - 1,
                                                "ratio of the fastest": fastest - 1})
    text = (folder / "gradual_overhead.md").read_text()
    assert f"median same-round ratio **{ratio - 1:+.1%}**" in text
    assert result["update_share"] == pytest.approx(sum(result["update_seconds"]) / seconds["plain"][0])
    assert result["update_seconds"], "no mask update was timed in the measured epoch"
