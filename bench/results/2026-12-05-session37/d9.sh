# Session 37 call 2 (H200, right after d7): records of old (main's kernels) and slotfix (wip/slot-lane0) in one
# session with d7's evict_fs record, then slotfix's grouped GEMM GPU tests and MoE memcheck.
SECONDS=0; DIR=$OUT/d9; source .ab3/s36/lib.sh
build old slotfix
record old 297654f
record slotfix 02da46b
gpu_tests slotfix
sanitize slotfix memcheck
cd $OUT && tar czf d9.tgz d9 && rm -rf d9
