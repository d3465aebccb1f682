# Session 37, after d0: evict = wip/gemm-evict (all, and b tiles that only one tile reads loaded with L2 evict_first, so
# that a's rows stay in L2 while the weights stream through) against all: A/B ABBA at 4096 tokens, every op, both
# routings; ncu's DRAM bytes of the fused SwiGLU at DeepSeek-V3 gate+up 4096 balanced for old, all and evict
# (a's rows read from DRAM more than once show as bytes past the 15.7 GB that weights, a and the outputs take
# once); then the GPU tests on evict if time is left. About 300 s.
SECONDS=0; DIR=$OUT/d4; source .ab3/s36/lib.sh
build old all evict
for t in all evict evict all; do ab $t --tokens 4096 --calls bf16,swiglu_fp8_out,fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR all evict; tail -3 $DIR/ab.err
for t in old all evict; do
  PYTHONPATH=$(tree $t) timeout 120 ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
    -k regex:grouped_gemm --launch-skip 1 --launch-count 1 python3 .ab3/s36/dram_swiglu.py > $DIR/dram_$t.log 2>&1
  echo "ncu $t rc=$? ${SECONDS}s"; grep -E "kgen |dram__bytes|hit_rate|duration" $DIR/dram_$t.log
done
[ $SECONDS -lt 330 ] && gpu_tests evict
cd $OUT && tar czf d4.tgz d4 && rm -rf d4
