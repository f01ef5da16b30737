#!/usr/bin/env bash
# Side-by-side router benchmark: omni-router next to vllm-router and sglang-router (PyPI),
# on the same fake workers, with the shared harness (../shared/bench). See README.md here.
#
#   bench/router/run.sh                 # pinned comparison + --processes run, short reps
#   REPS=5 DURATION=6 bench/router/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
VENV=${VENV:-.bench-venv}
REPS=${REPS:-3}
DURATION=${DURATION:-4}
OUT=${OUT:-bench/results/router-$(date +%Y%m%d-%H%M%S)}
OMNI=${OMNI:-$(command -v omni-router)}
ROUTER="$OMNI --worker {w1} --worker {w2} --host {host} --port {port} --log-level warning"

# 1. one router process each, --pin split (load generator on CPU 0, routers + workers on CPU 1)
"$VENV/bin/python" "$HARNESS/run_router_bench.py" --preset vllm-rr --preset sglang-rr \
    --router omni="$ROUTER" --scenarios chat,chat-delay,ttfb \
    --reps "$REPS" --duration "$DURATION" --out "$OUT/single" "$@"

# 2. --processes 2 against 1, unpinned (the kernel places processes)
"$VENV/bin/python" "$HARNESS/run_router_bench.py" --pin none --no-direct \
    --router omni-p1="$ROUTER" --router omni-p2="$ROUTER --processes 2" \
    --scenarios chat --reps "$REPS" --duration "$DURATION" --out "$OUT/processes" "$@"

echo "results: $OUT/single/summary.md $OUT/processes/summary.md"
