#!/usr/bin/env bash
# Installs omni-fleet and everything its tests use on a fresh Debian/Ubuntu machine (root or sudo).
# Idempotent: what is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_DISABLE_PIP_VERSION_CHECK=1
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  ((${#missing[@]})) || return 0
  local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"
}
command -v redis-server >/dev/null 2>&1 || apt_install redis-server
# tests/test_dashboard.py drives Debian's headless Chromium (no browser download)
command -v chromium >/dev/null 2>&1 || apt_install chromium
# tests/test_readme_examples.py runs the README's curl lines
command -v curl >/dev/null 2>&1 || apt_install curl

python3 -m pip install -q torch==2.13.0   # CPU wheel; an unpinned torch would pull a CUDA build
python3 -m pip install -q -e ".[dev]"
