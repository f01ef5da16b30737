#!/usr/bin/env bash
# Re-locks the reference environment (venv.sh installs exactly requirements.lock, with hashes):
# requirements.in resolved without torch (the project environment's is shared), then the official
# packages of official.in without their dependencies, as the registry stood on one day (so that
# re-locking the same .in files writes the same lock: tests/test_lock.py checks it). Run after
# editing either .in file (and move the day on to take newer releases).
#   scripts/reference/lock.sh [OUT]   # OUT default: requirements.lock beside this script
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-requirements.lock}
uv=${UV:-../../.venv/bin/uv}   # the dev extra's uv (pyproject.toml pins it)
no_torch=$(mktemp) && trap 'rm -f "$no_torch"' EXIT && echo torch >"$no_torch"
# --no-config: the project's own [tool.uv] overrides (its transformers 5) are not this lock's
compile=("$uv" pip compile --no-config --quiet --python-version 3.11
  --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header
  --exclude-newer 2026-12-07T00:00:00Z)
{
  echo "# The reference environment's exact set (scripts/reference/lock.sh writes it; venv.sh"
  echo "# installs it with --require-hashes --no-deps). Do not edit: edit the .in files, re-lock."
  "${compile[@]}" --excludes "$no_torch" requirements.in
  "${compile[@]}" --no-deps official.in
} >"$out"
