# Session 36 call 1c: paired = wip/gemm-paired 2d1a686 (main's kernels, K steps loaded in pairs so that both
# steps' requests for the same rows of b leave together), against old: A/B ABBA at the 4096-token shapes (weights
# streamed from DRAM), bf16, SwiGLU+FP8 and FP8, balanced and Zipf; the GPU tests and the MoE racecheck on paired.
# About 300 s.
SECONDS=0; DIR=$OUT/d1c; source .ab3/s36/lib.sh
build old paired
for t in old paired paired old; do ab $t --tokens 4096 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR old paired; tail -3 $DIR/ab.err
gpu_tests paired
sanitize paired racecheck
cd $OUT && tar czf d1c.tgz d1c && rm -rf d1c
