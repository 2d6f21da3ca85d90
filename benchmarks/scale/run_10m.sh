#!/bin/bash
# The 10M x 384 run of docs/scale.md ("The 10M run"), end to end, in segments; five of
# them are killed with kill -9 on purpose (one per phase) and the next resumes.
#   python benchmarks/scale/generate.py --out /tmp/dm/10m/shards --n-docs 10000000 \
#       --dim 384 --n-shards 1000
#   benchmarks/scale/run_10m.sh "$PWD"      # CODE_DIR: a checkout of the commit measured
# Every segment appends its start, end, wall seconds, exit status and load to
# /tmp/dm/t10m.log and its /usr/bin/time -v report to /tmp/dm/<segment>.err.
CODE=$1
export PYTHONPATH=$CODE/src
LOG=/tmp/dm/t10m.log
DATA=/tmp/dm/10m/shards OUT=/tmp/dm/run-10m APPLY=/tmp/dm/apply-10m
cd $CODE
seg() {  # seg NAME KILL_CONDITION(cmd, true when to kill; "" never) CMD...
  local name=$1 cond=$2; shift 2
  echo "$name start $(date -Is) $(cat /proc/loadavg)" >> $LOG
  local t0=$(date +%s.%N)
  setsid /usr/bin/time -v "$@" > /tmp/dm/$name.out 2> /tmp/dm/$name.err &
  local pid=$!
  local killed=0
  while kill -0 $pid 2>/dev/null; do
    if [ -n "$cond" ] && eval "$cond"; then
      kill -9 -- -$pid; killed=1
      echo "$name KILL -9 $(date -Is) cond: $cond" >> $LOG
    fi
    sleep 2
  done
  wait $pid; local rc=$?
  echo "$name end $(date -Is) rc=$rc killed=$killed wall=$(echo "$(date +%s.%N) - $t0" | bc) $(cat /proc/loadavg)" >> $LOG
  du -sb $OUT $APPLY 2>/dev/null >> $LOG
}
SEL="python benchmarks/scale/run.py --data $DATA --out $OUT --runner local --workers 2 --progress"
ncomp() { ls $OUT/_work/completions 2>/dev/null | wc -l; }
nexch() { ls $OUT/_work/exchange/*.json 2>/dev/null | wc -l; }
nparts() { ls $OUT/selected/part-*.parquet 2>/dev/null | wc -l; }
napply() { ls $APPLY/*.parquet 2>/dev/null | wc -l; }
T0=$(date +%s)
[ -e /tmp/dm/seg-plan.done ] || { seg seg-plan '[ $(( $(date +%s) - T0 )) -gt 150 ]' $SEL --results /tmp/dm/run-10m-seg-plan.json; touch /tmp/dm/seg-plan.done; }
[ -e /tmp/dm/seg-select.done ] || { seg seg-select '[ $(ncomp) -ge 12 ]' $SEL --results /tmp/dm/run-10m-seg-select.json; touch /tmp/dm/seg-select.done; }
[ -e /tmp/dm/seg-exchange.done ] || { seg seg-exchange '[ $(nexch) -ge 6 ]' $SEL --results /tmp/dm/run-10m-seg-exchange.json; touch /tmp/dm/seg-exchange.done; }
[ -e /tmp/dm/seg-write.done ] || { seg seg-write '[ $(nparts) -ge 3 ]' $SEL --results /tmp/dm/run-10m-seg-write.json; touch /tmp/dm/seg-write.done; }
[ -e /tmp/dm/seg-final.done ] || { seg seg-final '' $SEL --results /tmp/dm/run-10m-final.json; touch /tmp/dm/seg-final.done; }
[ -e /tmp/dm/seg-apply1.done ] || { seg seg-apply1 '[ $(napply) -ge 100 ]' python -m datamask.cli apply --input $DATA --selection $OUT --output $APPLY; touch /tmp/dm/seg-apply1.done; }
[ -e /tmp/dm/seg-apply2.done ] || { seg seg-apply2 '' python -m datamask.cli apply --input $DATA --selection $OUT --output $APPLY; touch /tmp/dm/seg-apply2.done; }
echo "all done $(date -Is)" >> $LOG
