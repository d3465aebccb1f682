# Session 37 call 2, where d0.sh ran out of time: the grouped GEMM GPU tests (the new ones with more tiles than SMs
# and K on both sides of the skew's gate included) and the MoE racecheck and memcheck on all = wip/gemm-all.
SECONDS=0; DIR=$OUT/d0b; source .ab3/s36/lib.sh
build all
gpu_tests all
sanitize all racecheck memcheck
cd $OUT && tar czf d0b.tgz d0b && rm -rf d0b
