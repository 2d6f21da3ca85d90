#!/usr/bin/env bash
# Session 22's one device call: issue 43's GPU figures at the code as it stands (3d4c158).
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
L=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 && echo "pip -e: ok" >>$L
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>$L 2>&1
python3 -c "import torch, datamask, os; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'cpus', os.cpu_count(), 'load', os.getloadavg())" >>$L 2>&1
END=585
f() {  # f CAP RESULTS FIGURE [run.py flags]: one figure, stopped at CAP s or at END
  local cap=$1 res=$2 fig=$3; shift 3
  local t=$(( END - SECONDS )); [ $t -gt $cap ] && t=$cap
  if [ $t -lt 30 ]; then echo "== $fig skipped: $t s left [$SECONDS s]" >>$L; return; fi
  mkdir -p "$res"
  echo "== $fig $* (up to $t s) [$SECONDS s] load $(cut -d' ' -f1-3 /proc/loadavg)" >>$L
  timeout -k 5 $t python3 benchmarks/gpu/run.py --figure $fig --keep-data --results "$res" "$@" >>$L 2>&1
  echo "   rc $? [$SECONDS s]" >>$L
}
f 35 $OUT correctness
f 100 $OUT sharded-384
f 150 $OUT sharded-384-cpu
f 75 $OUT group --size group_profile=0
f 100 $OUT/c400k sharded-384 --size chunk_size=400000
f 100 $OUT/c1m sharded-384 --size chunk_size=1000000
f 200 $OUT/w1536 sharded-1536 --size sharded_wide_n=1000000
echo "== end [$SECONDS s]" >>$L
grep -v '%|' $L | tail -c 9000
