#!/usr/bin/env bash
# Trains every grid of the CIFAR-10 reproduction (seed-major, resumable); see experiments/run.py.
# Each grid pins the commit that trains it ("code"), checked out once as a worktree beside this one.
# The translation-mode comparison goes first, because the library's default mode depends on it:
# PreCrop exact / layerwise / balanced at params 0.1 (both seeds), SynFlow at 0.1, then the three
# modes at the pareto point (15,000 params); then the rest of figures 2-3 and the baseline (grid
# core, both seeds), the issue's first priority; then the two paper claims still open, granularity
# (thm_comp, both seeds) and PreConfig (preconfig, all three seeds the issue asks for); then core's
# third seeds (an entry's own "seeds", where a claim is close), so that every claim is settled before
# figure 5; then every grid, seed-major; last, pareto_paper (figure 5 the paper's way, random weights
# at SynExp's densities: not in the issue's list, so after all of it). Extra arguments go to run.py
# (e.g. --commit).
cd "$(dirname "$0")/.."
# Issue 29 first: its fine-tuning grid keep_weights (a trained teacher pruned with kept weights and
# fine-tuned 3 epochs) on seed 3, whose teacher is trained, then the second teacher (grid
# keep_weights_teacher, 10 epochs) and the grid's seed 4; then issue 27's grids (against uniform
# width scaling), uniform_latency and uniform seed-major together, except that the allocation
# that acts on uniform_latency's tie (grid latency_floor) goes before uniform's second seed; then
# the floor on the residual streams alone (grid latency_stream_floor, ResNet-20: what the floors of
# both networks' evidence point to); then uniform_mobilenet, its latency plans' two seeds first
# (they decide auto's latency rule there).
python experiments/run.py --grid experiments/grids/keep_weights.json --match='-s3$' "$@" || exit
python experiments/run.py --grid experiments/grids/keep_weights_teacher.json "$@" || exit
python experiments/run.py --grid experiments/grids/keep_weights.json "$@" || exit
python experiments/run.py --grid experiments/grids/uniform_latency.json --match='latency0\.33' "$@" || exit
python experiments/run.py --grid experiments/grids/latency_floor.json "$@" || exit
python experiments/run.py --grid experiments/grids/uniform_latency.json \
  --grid experiments/grids/uniform.json "$@" || exit
python experiments/run.py --grid experiments/grids/latency_stream_floor.json "$@" || exit
python experiments/run.py --grid experiments/grids/uniform_mobilenet.json --match='latency0\.5' "$@" || exit
python experiments/run.py --grid experiments/grids/uniform_mobilenet.json "$@" || exit
GRIDS=()
for name in core thm_comp pareto preconfig balance; do
  GRIDS+=(--grid "experiments/grids/$name.json")
done
python experiments/run.py "${GRIDS[@]}" --match='precrop_params-params0\.1103-.*-s[01]$' "$@" &&
  python experiments/run.py "${GRIDS[@]}" --match='synflow-params0\.1-.*-s[01]$' "$@" &&
  python experiments/run.py "${GRIDS[@]}" --match='precrop_params-params0\.054736-mode.*-s[01]$' "$@" &&
  python experiments/run.py --grid experiments/grids/core.json --match='-s[01]$' "$@" &&
  python experiments/run.py --grid experiments/grids/thm_comp.json --match='-s[01]$' "$@" &&
  python experiments/run.py --grid experiments/grids/preconfig.json "$@" &&
  python experiments/run.py --grid experiments/grids/core.json "$@" &&
  python experiments/run.py "${GRIDS[@]}" "$@" &&
  exec python experiments/run.py --grid experiments/grids/pareto_paper.json "$@"
