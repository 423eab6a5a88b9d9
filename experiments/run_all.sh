#!/usr/bin/env bash
# Trains every grid of the CIFAR-10 reproduction (seed-major, resumable); see experiments/run.py.
# Extra arguments go to run.py (e.g. --commit, --code_dir /path/to/pinned/worktree).
cd "$(dirname "$0")/.."
exec python experiments/run.py \
  --grid experiments/grids/core.json --grid experiments/grids/thm_comp.json \
  --grid experiments/grids/pareto.json --grid experiments/grids/preconfig.json "$@"
