#!/usr/bin/env bash
# One device call of the GPU kit:  bash benchmarks/gpu/run.sh PART [run.py flags]
# (PART 1, 2 or 3; see benchmarks/gpu/README.md). Results land in $OUT when it is set.
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
log=${OUT:-/tmp}/log-part$1.txt
$PY benchmarks/gpu/run.py --part "$@" 2>&1 | tee "$log"
