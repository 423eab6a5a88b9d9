"""Benchmark: how fast the ``keras-precrop`` command answers ``--help`` and argument errors.

Each command runs in a fresh interpreter, as from a user's shell: the console
script pip writes for ``keras-precrop=keras_precrop.cli:main`` (run with this
interpreter, without a version manager's shim in front), ``--help``, a
subcommand's ``--help`` and an argument error; beside them the bare
interpreter start and ``import keras`` (TensorFlow under it), which every
``--help`` paid before issue 45. Commands are interleaved round by round, so
that the load of a shared machine falls on all of them alike; the table gives
the median and the fastest of the rounds. Goal (issue 45): ``keras-precrop
--help`` in under a second. No TensorFlow or Keras is imported here.

Usage::

    python benchmarks/bench_cli.py [--rounds 7]

Writes ``benchmarks/results/cli.json`` and ``cli.md``.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
GOAL_S = 1.0  # keras-precrop --help
# What pip writes for the entry point keras-precrop=keras_precrop.cli:main.
CONSOLE_SCRIPT = """\
import re
import sys
from keras_precrop.cli import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def _commands(script):
    """``{label: (argv, expected exit code)}`` of the commands timed."""
    python = sys.executable
    return {
        "python -c pass (interpreter start)": ([python, "-c", "pass"], 0),
        "keras-precrop --help": ([python, script, "--help"], 0),
        "keras-precrop precrop --help": ([python, script, "precrop", "--help"], 0),
        "keras-precrop precrop resnet20 --mode bogus (argument error)":
            ([python, script, "precrop", "resnet20", "--mode", "bogus"], 2),
        "python -c 'import keras' (what --help imported before)":
            ([python, "-c", "import keras"], 0),
    }


def _run(argv, code, env):
    """Seconds one command takes, start to exit; raises if it exits with another code."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    seconds = time.perf_counter() - start
    if done.returncode != code:
        raise RuntimeError(f"{argv} exited {done.returncode}, not {code}: {done.stderr[-2000:]}")
    return seconds


def bench(rounds):
    """``{label: [seconds per round]}``, the commands interleaved round by round."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as folder:
        script = pathlib.Path(folder) / "keras-precrop"
        script.write_text(CONSOLE_SCRIPT)
        commands = _commands(str(script))
        times = {label: [] for label in commands}
        for _ in range(rounds):
            for label, (argv, code) in commands.items():
                times[label].append(_run(argv, code, env))
    return times


def _markdown(result):
    m = result["machine"]
    load = ", ".join(f"{x:.1f}" for x in m["load_average_at_start"])
    lines = ["# `keras-precrop --help` and argument errors: wall time", "",
             f"Fresh interpreter per command, {result['rounds']} interleaved rounds; machine: "
             f"{m['machine']}, {m['usable_cpus']} usable CPUs, Python {m['python']}, load average "
             f"at start {load}.", "",
             "| command | median s | fastest s |", "|---|---:|---:|"]
    for label, seconds in result["seconds"].items():
        lines.append(f"| {label} | {statistics.median(seconds):.2f} | {min(seconds):.2f} |")
    help_s = statistics.median(result["seconds"]["keras-precrop --help"])
    verdict = "met" if help_s < GOAL_S else "not met"
    lines += ["", f"Goal `keras-precrop --help` median < {GOAL_S:.0f} s: {verdict} ({help_s:.2f} s).", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    machine = {"machine": platform.machine(), "python": platform.python_version(),
               "usable_cpus": len(os.sched_getaffinity(0)), "load_average_at_start": list(os.getloadavg())}
    result = {"rounds": args.rounds, "machine": machine, "seconds": bench(args.rounds)}
    text = _markdown(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cli.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "cli.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
