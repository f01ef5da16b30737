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
# response_format (constrained decoding, worker/stages/grammar.py): xgrammar, SGLang's grammar
# backend, without the triton it pulls for GPU kernels (its CPU path needs none)
python3 -m pip install -q --no-deps "xgrammar==0.2.9" "apache-tvm-ffi==0.1.15.post2"
# engine.backend: sglang (worker/engines/sglang): SGLang without the CUDA torch it pins, and
# the torchvision its imports need, kept out of site-packages (patches.py says why)
python3 -m pip install -q --no-deps -r scripts/sglang-cpu.txt
extras=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/omni_sglang_extras
[[ -d $extras/torchvision ]] || python3 -m pip install -q --no-deps --target "$extras" "torchvision==0.28.0"
