# Session 26 call 7: ncu's per-instruction stall samples of the 64-row kernel (L = 512, per-sequence 64x64) and of
# a packed item (L = 65), for the next session's look at the item's chain.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/ncu
for L in 512 65; do
timeout 120 ncu --profile-from-start off --kernel-name regex:attention_prefill --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight -o $OUT/ncu/L$L python3 bench/results/2026-12-03-session24/ncu/ncu_case.py $L > $OUT/ncu/ncu_L$L.log 2>&1; echo "L=$L rc=$?"; tail -2 $OUT/ncu/ncu_L$L.log
timeout 60 ncu --import $OUT/ncu/L$L.ncu-rep --page source --csv --print-source sass > $OUT/ncu/L${L}_sass.csv 2>&1; echo "sass rc=$? $(wc -l < $OUT/ncu/L${L}_sass.csv) lines"; head -c 600 $OUT/ncu/L${L}_sass.csv; echo
timeout 60 ncu --import $OUT/ncu/L$L.ncu-rep --page details > $OUT/ncu/L${L}_details.txt 2>&1
done
cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu
