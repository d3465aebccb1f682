# Session 36, second call: the MoE racecheck on old (main's kernels) with the sanitizer case as it is now (d0 found
# 22 hazard lines on all, between the scheduler warp's write of a schedule slot and the loading warp's read of it,
# in the case's new 152-tile calls, the first to reuse a slot), then d4's A/B of evict against all at 4096 tokens
# and ncu's DRAM bytes (no tests). slotfix = wip/slot-lane0 (main, with lane 0 alone reading a schedule slot).
SECONDS=0; DIR=$OUT/d5; source .ab3/s36/lib.sh
build old slotfix all evict
sanitize old racecheck; mv $DIR/san_moe_racecheck.log $DIR/san_moe_racecheck_old.log
grep -A1 "Race reported" $DIR/san_moe_racecheck_old.log | head -6
sanitize slotfix racecheck; mv $DIR/san_moe_racecheck.log $DIR/san_moe_racecheck_slotfix.log
grep -A1 "Race reported" $DIR/san_moe_racecheck_slotfix.log | head -6
for t in all evict evict all; do ab $t --tokens 4096 --calls bf16,swiglu_fp8_out,fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR all evict; tail -3 $DIR/ab.err
for t in old all evict; do
  [ $SECONDS -gt 520 ] && break
  PYTHONPATH=$(tree $t) timeout 100 ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
    -k regex:grouped_gemm --launch-skip 1 --launch-count 1 python3 .ab3/s36/dram_swiglu.py > $DIR/dram_$t.log 2>&1
  echo "ncu $t rc=$? ${SECONDS}s"; grep -E "kgen |dram__bytes|hit_rate|duration" $DIR/dram_$t.log
done
cd $OUT && tar czf d5.tgz d5 && rm -rf d5
