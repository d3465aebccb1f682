# Session 37 call 3, for a lease with little left after the start: the copy bandwidth both ways; lean_ev's grouped
# GEMM GPU tests, its MoE memcheck and racecheck; then its record (main's bench, copy bandwidth now timed call by
# call) as time allows. lean_ev = wip/lean-evict (9fd6e5d) = main (be8282c) + the leaner SwiGLU epilogue + evict_first
# and paired loads for b tiles no other tile reads.
SECONDS=0; DIR=$OUT/d12; source .ab3/s36/lib.sh
python3 .ab3/s36/copy_rates.py 2>&1 | tee $DIR/copy_rates.txt
build lean_ev
gpu_tests lean_ev
sanitize lean_ev memcheck racecheck
grep -A1 "Race reported" $DIR/san_moe_racecheck.log | head -4
record lean_ev 9fd6e5d
grep -E "decode" $DIR/record_lean_ev/SUMMARY.md | cut -d'|' -f3,4,7
