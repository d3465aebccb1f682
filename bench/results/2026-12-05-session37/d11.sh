# Session 37 call 3 (H200), short form of d10 for a lease with about 250 s left after the start: the copy
# bandwidth both ways, lean's record (main's bench, copy bandwidth now timed call by call), its GPU tests, its MoE
# memcheck and racecheck as time allows. lean = wip/slot-lean (7d23e8c) = main (be8282c) + the leaner SwiGLU epilogue.
SECONDS=0; DIR=$OUT/d11; source .ab3/s36/lib.sh
python3 .ab3/s36/copy_rates.py 2>&1 | tee $DIR/copy_rates.txt
build lean
record lean 7d23e8c
grep -E "decode" $DIR/record_lean/SUMMARY.md | cut -d'|' -f3,4,7
gpu_tests lean
sanitize lean memcheck racecheck
cd $OUT && tar czf d11.tgz d11 && rm -rf d11
