#!/usr/bin/env bash
# Side-by-side router benchmark: omni-router next to vllm-router and sglang-router (PyPI),
# on the same fake workers, with the shared harness (../shared/bench). See README.md here.
#
#   bench/router/run.sh                 # pinned comparison + --processes run, short reps
#   REPS=5 DURATION=6 bench/router/run.sh
#   COMPARE="before=b26e7e0 pretrim=2c0231e" SCENARIOS=chat,audio PROCESSES=no bench/router/run.sh
#
# COMPARE adds omni-router snapshots (NAME=COMMIT, exported with git archive) to step 1 beside
# the installed omni-router: before/after figures from one run, on the same box at the same time.
set -euo pipefail
cd "$(dirname "$0")/../.."
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
VENV=${VENV:-.bench-venv}
REPS=${REPS:-3}
DURATION=${DURATION:-4}
SCENARIOS=${SCENARIOS:-chat,chat-delay,ttfb}
PRESETS=${PRESETS:-vllm-rr sglang-rr}
COMPARE=${COMPARE:-}
PROCESSES=${PROCESSES:-yes}
OUT=${OUT:-bench/results/router-$(date +%Y%m%d-%H%M%S)}
OMNI=${OMNI:-$(command -v omni-router)}
ARGS="--worker {w1} --worker {w2} --host {host} --port {port} --log-level warning"
ROUTER="$OMNI $ARGS"

extra=()
for preset in $PRESETS; do extra+=(--preset "$preset"); done
for pair in $COMPARE; do
    name=${pair%%=*} ref=${pair#*=}
    src="$OUT/src-$name"
    mkdir -p "$src"
    git archive "$ref" router fleet | tar -x -C "$src"
    extra+=(--router "omni-$name=env PYTHONPATH=$(cd "$src" && pwd) python3 -m router.cli $ARGS")
done

# 1. one router process each, --pin split (load generator on CPU 0, routers + workers on CPU 1)
"$VENV/bin/python" "$HARNESS/run_router_bench.py" "${extra[@]}" \
    --router omni="$ROUTER" --scenarios "$SCENARIOS" \
    --reps "$REPS" --duration "$DURATION" --out "$OUT/single" "$@"

# 2. --processes 2 against 1, unpinned (the kernel places processes)
if [ "$PROCESSES" = yes ]; then
    "$VENV/bin/python" "$HARNESS/run_router_bench.py" --pin none --no-direct \
        --router omni-p1="$ROUTER" --router omni-p2="$ROUTER --processes 2" \
        --scenarios chat --reps "$REPS" --duration "$DURATION" --out "$OUT/processes" "$@"
fi

echo "results: $OUT/single/summary.md"
if [ "$PROCESSES" = yes ]; then echo "         $OUT/processes/summary.md"; fi
