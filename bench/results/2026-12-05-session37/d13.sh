# Session 37's last call, for a lease with little left: the copy bandwidth both ways; roll (wip/fp8-rolling, 7c0b5be:
# main + FP8 products in 64-column parts, two accumulator sets in turn) FP8 GPU tests and an A/B ABBA against main's
# kernels (slotfix = main's kernels, be8282c) in FP8; then lean_ev (wip/lean-evict, 9fd6e5d)'s GPU tests, MoE
# sanitizers and record as time allows.
SECONDS=0; DIR=$OUT/d13; source .ab3/s36/lib.sh
python3 .ab3/s36/copy_rates.py 2>&1 | tee $DIR/copy_rates.txt
build roll slotfix lean_ev
PYTHONPATH=$(tree roll) timeout 90 python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py > $DIR/roll_fp8_tests.log 2>&1; echo "roll fp8 tests rc=$? ${SECONDS}s"; tail -1 $DIR/roll_fp8_tests.log
for t in slotfix roll roll slotfix; do ab $t --calls fp8 --routing balanced,zipf; done
python3 tools/ab_summary.py $DIR slotfix roll; tail -3 $DIR/ab.err
gpu_tests lean_ev
sanitize lean_ev racecheck memcheck
record lean_ev 9fd6e5d
grep -E "decode" $DIR/record_lean_ev/SUMMARY.md | cut -d'|' -f3,4,7
