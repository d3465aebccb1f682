# Session 37 call 1 (H200): evict = wip/gemm-evict (609e4cf: every branch of session 35, the leaner SwiGLU epilogue,
# evict_first and paired loads for b tiles read once); evict_fs = wip/gemm-evict-fp8skew (e359b35: evict with the
# warpgroups' skew in FP8 single blocks only). A/B ABCCBA over processes against old (main's kernels) at every op,
# routing and token count; then the record of evict_fs; then the MoE racecheck on old and slotfix (wip/slot-lane0).
SECONDS=0; DIR=$OUT/d7; source .ab3/s36/lib.sh
build old evict evict_fs slotfix
for t in old evict evict_fs evict_fs evict old; do ab $t --calls bf16,swiglu_fp8_out,fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR old evict evict_fs; tail -3 $DIR/ab.err
record evict_fs e359b35
for t in old slotfix; do
  sanitize $t racecheck; mv $DIR/san_moe_racecheck.log $DIR/san_moe_racecheck_$t.log 2>/dev/null
  grep -A1 "Race reported" $DIR/san_moe_racecheck_$t.log | head -4; tail -1 $DIR/san_moe_racecheck_$t.log
done
cd $OUT && tar czf d7.tgz d7 && rm -rf d7
