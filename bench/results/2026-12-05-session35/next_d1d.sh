# Session 36 call 1d: skiprows = wip/gemm-skip-rows 42a0e71 (fp8ss, and in 16-bit a warpgroup whose 64 rows all
# lie past the group's end only releases the stages) against its parent fp8ss: A/B ABBA at Zipf routing (where
# groups' last tiles are short), bf16 and SwiGLU+FP8, both token counts; the GPU tests and the MoE racecheck on
# skiprows. About 300 s.
SECONDS=0; DIR=$OUT/d1d; source .ab3/s36/lib.sh
build fp8ss skiprows
for t in fp8ss skiprows skiprows fp8ss; do ab $t --calls bf16,swiglu_fp8_out --routing zipf; done
python3 tools/ab_summary.py $DIR fp8ss skiprows; tail -3 $DIR/ab.err
gpu_tests skiprows
sanitize skiprows racecheck
cd $OUT && tar czf d1d.tgz d1d && rm -rf d1d
