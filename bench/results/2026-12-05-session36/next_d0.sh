# Session 37 call 1: all = wip/gemm-all (every branch of session 35 merged on main: the 16-bit skew, silu by one
# MUFU an exponential and a reciprocal, FP8's SS form with the skew, the skipped rows, the paired loads) and
# skiprows = wip/gemm-skip-rows (all of it but the paired loads and the leaner SwiGLU epilogue, which has silu by
# __fdividef), against old (main's kernels). A/B ABCCBA over processes, every op (bf16,
# SwiGLU+FP8, FP8), both routings and token counts; then the grouped GEMM GPU tests and the MoE sanitizers on all.
# About 500 s (session 31's c4.sh ran 8 A/B processes, tests, both sanitizers, ncu and the record in one call).
# d0b.sh repeats the tests and sanitizers if this call ran out of time for them.
SECONDS=0; DIR=$OUT/d0; source .ab3/s36/lib.sh
build old skiprows all
for t in old skiprows all all skiprows old; do ab $t --calls bf16,swiglu_fp8_out,fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR old skiprows all; python3 tools/ab_summary.py $DIR skiprows all  # the paired loads' share
tail -3 $DIR/ab.err
gpu_tests all
sanitize all racecheck memcheck
cd $OUT && tar czf d0.tgz d0 && rm -rf d0
