#!/usr/bin/env bash
# One device call of prepared figures, each in its own process under `timeout`:
#   bash benchmarks/gpu/call.sh PRESET        (on the device: results in $OUT, log in $OUT/log.txt)
# PRESET  issue43: correctness, sharded 1M x 384 on the GPU and on the 16 CPU cores, the
#                  1M file, --chunk-size 400k and 1M, sharded 1M x 1536 (407 s on an H200
#                  on 2026-11-30; results/2026-11-30-h200-call1)
#         sizes:   --chunk-size 50k and 200k, then the greedy figure (171 s there)
#         10m:     sharded 10M x 384 on the GPU (about 100 s of generation and 5-6 min of
#                  selection at 2026-11-30's 30,954 documents/s), then --chunk-size 1M again
# A figure that would end after END seconds (585) is skipped; each figure's JSON goes to
# $OUT or a folder under it (the tool returns 8 files at most, 2 folders down). Edit the
# presets here, not on the device: each call carries the checkout afresh. KIT_FLAGS adds
# run.py flags to every figure (here: KIT_FLAGS="--device cpu --smoke --work /tmp/w").
set -uo pipefail
case ${1:-} in
  issue43 | sizes | 10m) ;;
  *) echo "usage: bash benchmarks/gpu/call.sh issue43|sizes|10m" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
OUT=${OUT:-/tmp/datamask-gpu-out}
mkdir -p "$OUT"
L=$OUT/log.txt
if [ -z "${KIT_FLAGS:-}" ]; then  # on the device: the `datamask` command too (as run.sh)
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    && echo "pip -e: ok" >>"$L"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$L" 2>&1
python3 -c "import torch, datamask, os; print('torch', torch.__version__, torch.version.cuda, 'cpus', os.cpu_count(), 'load', os.getloadavg())" >>"$L" 2>&1
END=585
f() {  # f CAP RESULTS FIGURE [run.py flags]: one figure, stopped at CAP s or at END
  local cap=$1 res=$2 fig=$3
  shift 3
  local t=$((END - SECONDS))
  [ $t -gt "$cap" ] && t=$cap
  if [ $t -lt 30 ]; then echo "== $fig skipped: $t s left [$SECONDS s]" >>"$L"; return; fi
  mkdir -p "$res"
  echo "== $fig $* (up to $t s) [$SECONDS s] load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$L"
  timeout -k 5 "$t" python3 benchmarks/gpu/run.py --figure "$fig" --keep-data --results "$res" ${KIT_FLAGS:-} "$@" >>"$L" 2>&1
  echo "   rc $? [$SECONDS s]" >>"$L"
}
case $1 in
  issue43)
    f 35 "$OUT" correctness
    f 100 "$OUT" sharded-384
    f 150 "$OUT" sharded-384-cpu
    f 75 "$OUT" group --size group_profile=0
    f 100 "$OUT/c400k" sharded-384 --size chunk_size=400000
    f 100 "$OUT/c1m" sharded-384 --size chunk_size=1000000
    f 200 "$OUT/w1536" sharded-1536 --size sharded_wide_n=1000000 ;;
  sizes)
    f 100 "$OUT/c50k" sharded-384 --size chunk_size=50000
    f 100 "$OUT/c200k" sharded-384 --size chunk_size=200000
    f 100 "$OUT/g" greedy ;;
  10m)
    f 500 "$OUT/s10m" sharded-384 --size sharded_n=10000000
    f 80 "$OUT/c1m" sharded-384 --size chunk_size=1000000 ;;
esac
echo "== end [$SECONDS s]" >>"$L"
grep -v '%|' "$L" | tail -c 9000
