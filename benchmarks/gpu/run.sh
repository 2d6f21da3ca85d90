#!/usr/bin/env bash
# One device call of the GPU kit:  bash benchmarks/gpu/run.sh PART [run.py flags]
# (PART 1, 2, 3, or all: every figure in one call; see benchmarks/gpu/README.md).
# Results land in $OUT when it is set; the log beside the generated data (the tool
# brings back 8 files: 7 figures and RESULTS.md), its tail in the call's output.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/gpu/run.sh PART [run.py flags]" >&2; exit 2; }
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
# datamask from this checkout, on the image's own torch (pyproject asks torch>=2.2; the
# device reaches no registry): on the device only ($OUT set), pyproject's install with no
# dependencies and no build isolation; the source folder on PYTHONPATH either way, so a
# failed install only loses the `datamask` command. Never here: it would repoint the
# shared editable install.
if [ -n "${OUT:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    && echo "pip install -e . (no deps): ok" || echo "pip install -e . (no deps) failed"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, datamask; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), '| datamask', datamask.__version__)" || exit 1
part=$1
shift
if [ "$part" = all ]; then what=(--all); else what=(--part "$part"); fi
log=/tmp/datamask-gpu-log-$part.txt
$PY benchmarks/gpu/run.py "${what[@]}" "$@" 2>&1 | tee "$log"
