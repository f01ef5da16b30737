#!/usr/bin/env bash
# The wheels bench/gpu_check.py needs on a bare GPU machine (CPython 3.12 with torch, triton and
# transformers installed, no network), in .gpu-bundle/ (git-ignored; it travels with the
# working tree): what such a machine lacks of the planner's and the worker's imports (pydantic
# and its companions) and transformers as this project locks it. Versions and hashes come from
# uv.lock, the one lock: the bundle is the locked set, for the machine's Python.
#   bench/gpu_bundle.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
out=.gpu-bundle
rm -rf "$out" && mkdir -p "$out"
req=$(mktemp)
trap 'rm -f "$req"' EXIT
python3 - "$req" <<'PY'
import sys, tomllib
WANTED = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "transformers")
lock = tomllib.load(open("uv.lock", "rb"))
with open(sys.argv[1], "w") as f:
    for p in lock["package"]:
        if p["name"] in WANTED:
            hashes = " ".join(f"--hash={w['hash']}" for w in p.get("wheels", []))
            f.write(f"{p['name']}=={p['version']} {hashes}\n")
PY
python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$req" -d "$out" \
  --python-version "$py" --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
du -sh "$out" && ls "$out"
