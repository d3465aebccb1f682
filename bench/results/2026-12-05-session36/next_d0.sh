# Session 37 call 1: all = wip/gemm-all (every branch of session 35 merged: the 16-bit skew, silu by __fdividef,
# FP8's SS form with the skew, the skipped rows, the paired loads; on main) against old (main's kernels). A/B ABBA
# over processes, every op (bf16, SwiGLU+FP8, FP8), both routings and token counts. About 350 s. If `all` gains at
# every shape, d0b.sh (tests, sanitizers) then the merge and d2.sh; where it loses, d1*.sh find which change.
SECONDS=0; DIR=$OUT/d0; source .ab3/s36/lib.sh
build old all
for t in old all all old; do ab $t --calls bf16,swiglu_fp8_out,fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR old all; tail -3 $DIR/ab.err
cd $OUT && tar czf d0.tgz d0 && rm -rf d0
