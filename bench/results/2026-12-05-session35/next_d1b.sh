# Session 36 call 1b: fp8ss = wip/fp8-ss 9cfcaf2 (both, with FP8's A from shared memory and the skew in FP8 too),
# against old: FP8 A/B ABBA, balanced; the grouped GEMM GPU tests and the MoE sanitizers on fp8ss (it holds every
# change of d1 too). About 250 s.
SECONDS=0; DIR=$OUT/d1b; source .ab3/s36/lib.sh
build old fp8ss
for t in old fp8ss fp8ss old; do ab $t --calls fp8 --routing balanced; done
python3 tools/ab_summary.py $DIR old fp8ss; tail -3 $DIR/ab.err
gpu_tests fp8ss
sanitize fp8ss racecheck memcheck
cd $OUT && tar czf d1b.tgz d1b && rm -rf d1b
