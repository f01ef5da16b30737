#!/usr/bin/env bash
# Builds the isolated reference environment for the equality tests of Qwen3-TTS and Qwen3-ASR:
# the official `qwen-tts` and `qwen-asr` packages, which pin transformers 4.57, in a venv that
# shares the project environment's torch (its site-packages on the path after the venv's own, as
# --system-site-packages would share the system's) and holds exactly requirements.lock beside it
# (transformers 4.57.6, its tokenizers and huggingface-hub, the packages' own: hashes checked,
# nothing resolved here; lock.sh re-locks). Idempotent: a finished venv (its marker, which names
# the lock's digest) is kept; it follows the project environment it is called from.
#
#   OMNI_PROJECT_PYTHON=.venv/bin/python scripts/reference/venv.sh [DIR]
#   # DIR default: $OMNI_REFERENCE_VENV or ~/.cache/omni-fleet/reference-venv (CI: its own folder)
#
# Only optional imports that the checked code paths never call are stubbed (see STUBS below):
# the 25 Hz tokenizer's sox/onnxruntime/torchaudio (the 12 Hz models never build it) and the
# forced aligner's nagisa (Japanese word splitting; not used for transcripts). Everything the
# checked paths run (transformers, librosa's mel filters and resampling, soundfile, einops) is
# the real package.
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1

DIR="${1:-${OMNI_REFERENCE_VENV:-$HOME/.cache/omni-fleet/reference-venv}}"
HERE=$(cd "$(dirname "$0")" && pwd)
PROJECT_PY="${OMNI_PROJECT_PYTHON:-$HERE/../../.venv/bin/python}"
PROJECT_SITE=$("$PROJECT_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
MARKER="$DIR/.omni-reference-$(sha256sum "$HERE/requirements.lock" | cut -c1-12)"
PY="$DIR/bin/python"
share_project_site() {  # (the project environment may have moved: CI builds one per run)
  local site
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$PROJECT_SITE" >"$site/omni_project_site.pth"
}
[[ -f "$MARKER" ]] && { share_project_site; echo "$DIR"; exit 0; }

rm -rf "$DIR"
# uv (the project environment's: the dev extra's) installs the lock in seconds; pip, where the
# environment has none, in about 40 s. (--no-config: the project's overrides are not the lock's)
uv=$(dirname "$PROJECT_PY")/uv
if [[ -x $uv ]]; then
  "$PROJECT_PY" -m venv --without-pip "$DIR"
  share_project_site
  "$uv" pip install -q --no-config --python "$PY" --require-hashes --no-deps -r "$HERE/requirements.lock" >&2
else
  "$PROJECT_PY" -m venv "$DIR"
  share_project_site
  "$PY" -m pip install -q --require-hashes --no-deps -r "$HERE/requirements.lock" >&2
fi

SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
STUBS="$SITE/omni_reference_stubs"
mkdir -p "$STUBS/torchaudio/compliance"
# Stubs raise if anything actually calls them: a checked path that needs one fails loudly.
for mod in sox onnxruntime nagisa; do
  cat >"$STUBS/$mod.py" <<EOF
def __getattr__(name):
    raise RuntimeError("omni-fleet reference venv: '$mod.' + name + ' is stubbed (never used by the checked paths)")
EOF
done
: >"$STUBS/torchaudio/__init__.py"
: >"$STUBS/torchaudio/compliance/__init__.py"
cat >"$STUBS/torchaudio/compliance/kaldi.py" <<'EOF'
def __getattr__(name):
    raise RuntimeError("omni-fleet reference venv: torchaudio.compliance.kaldi is stubbed")
EOF
# Appended to sys.path after site-packages: a real install of any of these wins.
echo "$STUBS" >"$SITE/omni_reference_stubs.pth"

"$PY" - <<'EOF' >&2
import transformers, qwen_tts, qwen_asr  # noqa: F401
assert transformers.__version__.startswith("4.57."), transformers.__version__
from qwen_tts.core.models import Qwen3TTSForConditionalGeneration  # noqa: F401
from qwen_asr.core.transformers_backend import Qwen3ASRForConditionalGeneration  # noqa: F401
EOF
touch "$MARKER"
echo "$DIR"
