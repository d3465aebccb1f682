# Session 36 call 1: skew = wip/gemm-skew 01cc8f1 (16-bit warpgroups two K steps apart), both = wip/gemm-both
# 5dfb181 (skew and the SwiGLU epilogue's __fdividef), against old (main's kernels). A/B ABCCBA over processes in
# bf16 and the fused SwiGLU+FP8, balanced and Zipf. About 400 s; then d1b.sh at once (the machine stays warm 30 s).
SECONDS=0; DIR=$OUT/d1; source .ab3/s36/lib.sh
build old skew both
for t in old skew both both skew old; do ab $t --calls bf16,swiglu_fp8_out --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR old skew both; tail -3 $DIR/ab.err
cd $OUT && tar czf d1.tgz d1 && rm -rf d1
