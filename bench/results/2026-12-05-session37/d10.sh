# Session 37 call 3 (H200): lean = wip/slot-lean (7d23e8c: main + lane 0 alone reading a schedule slot + the leaner
# SwiGLU epilogue, silu by one MUFU ex2 and one rcp). First the copy bandwidth in a graph and call by call; then
# lean's record (main's bench, whose copy bandwidth is now timed call by call), its grouped GEMM GPU tests, its MoE
# memcheck and racecheck; then, as time allows, an A/B ABBA against old (main's kernels).
SECONDS=0; DIR=$OUT/d10; source .ab3/s36/lib.sh
python3 .ab3/s36/copy_rates.py 2>&1 | tee $DIR/copy_rates.txt
build lean old
record lean 7d23e8c
gpu_tests lean
sanitize lean memcheck racecheck
for t in old lean lean old; do [ $SECONDS -gt 480 ] || ab $t --calls bf16,swiglu_fp8_out,fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR old lean; tail -3 $DIR/ab.err
cd $OUT && tar czf d10.tgz d10 && rm -rf d10
