#!/usr/bin/env bash
# Installs omni-fleet on a fresh Debian/Ubuntu machine with Python 3.11 (root or sudo): the system
# packages it runs with, then exactly the locked set (uv.lock) into the project's own environment,
# .venv/ (or $UV_PROJECT_ENVIRONMENT), never into the system Python.
#
#   scripts/install.sh         what serving needs: the planner, worker, router, omni-bench and the
#                              local fleet (no test tools, no browser)
#   scripts/install.sh --dev   and what the tests need: the dev extra (pytest, ruff, mypy, the
#                              openai SDK, ...) and Debian's Chromium (the dashboard's test)
#
# Each is exact: the environment holds that set and nothing else (a --dev environment installed
# again without --dev loses the test tools). Idempotent: a second run takes seconds (uv's cache).
set -euo pipefail
cd "$(dirname "$0")/.."
dev=false
case "${1:-}" in
  "") ;;
  --dev) dev=true ;;
  *) echo "usage: scripts/install.sh [--dev]   (--dev: the tests' tools too)" >&2; exit 2 ;;
esac

UV_VERSION=0.13.9   # the uv that wrote uv.lock (also in the dev extra)
TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl   # pyproject [tool.uv.sources]

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  ((${#missing[@]})) || return 0
  local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"
}
command -v redis-server >/dev/null 2>&1 || apt_install redis-server
# tests/test_dashboard.py drives Debian's headless Chromium (no browser download)
$dev && { command -v chromium >/dev/null 2>&1 || apt_install chromium; }
# the turn-detection tests speak with Debian's espeak-ng (tests/spoken.py)
$dev && { command -v espeak-ng >/dev/null 2>&1 || apt_install espeak-ng; }
# stage processes allocate with jemalloc (worker/runtime/process.py: a CPU decode step is a few
# hundred small tensors, 13 % faster than with glibc's allocator)
apt_install libjemalloc2
# the torch wheel's download below, and the README's curl lines
command -v curl >/dev/null 2>&1 || apt_install curl

# uv, in a folder of its own: Debian's Python refuses pip installs into itself (PEP 668)
uv=$(command -v uv || true)
if [[ -z $uv || $("$uv" --version | cut -d' ' -f2) != "$UV_VERSION" ]]; then
  tools=${XDG_CACHE_HOME:-$HOME/.cache}/omni-fleet/uv-$UV_VERSION
  if [[ ! -x $tools/bin/uv ]]; then
    python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
  fi
  uv=$tools/bin/uv
fi

# The CPU build of torch: the machine's wheel folder has it on these hosts; elsewhere it comes
# from PyTorch's CPU index. uv checks it against the lock's sha256 either way.
if [[ ! -e wheels/$TORCH_WHEEL ]]; then
  mkdir -p wheels
  if [[ -e /opt/wheels/$TORCH_WHEEL ]]; then
    ln -s "/opt/wheels/$TORCH_WHEEL" "wheels/$TORCH_WHEEL"
  else
    curl -fL --retry 3 -o "wheels/$TORCH_WHEEL.part" \
      "https://download.pytorch.org/whl/cpu/${TORCH_WHEEL/+/%2B}"
    mv "wheels/$TORCH_WHEEL.part" "wheels/$TORCH_WHEEL"
  fi
fi

# Exactly what uv.lock pins (--frozen: the lock is not re-resolved), the project editable
extras=(--extra local --extra bench)
$dev && extras=(--extra dev)   # (which holds local and bench)
"$uv" sync --frozen --python 3.11 "${extras[@]}"
env_dir=${UV_PROJECT_ENVIRONMENT:-.venv}
echo "omni-fleet is installed in $env_dir: run $env_dir/bin/omni-router, or source $env_dir/bin/activate"
