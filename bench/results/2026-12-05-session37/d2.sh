# Session 36 call 2 (main's tree after merging what d1 found): the grouped GEMM record, peers in the same run (now
# with the dense FP8 cuBLAS column and the streaming bound; the SM clock sampled meanwhile), and the FP8 error
# with and without two-level accumulation.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/d2/record
SECONDS=0
timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/d2/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/d2/build.log
timeout 120 python3 tools/fp8_accumulation_error.py > $OUT/d2/fp8_accumulation.jsonl 2> $OUT/d2/fp8_accumulation.err; echo "accumulation rc=$? ${SECONDS}s"; tail -3 $OUT/d2/fp8_accumulation.err
python3 -c "
import json
for l in open('$OUT/d2/fp8_accumulation.jsonl'):
    r = json.loads(l); print(r['k'], r['inputs'], r['method'], r.get('rel_rms'), r.get('max_over_rms'), r.get('failed', ''))
"
# The SM clock and power while the record runs (read-only queries), to test the power-limit explanation of the
# FP8 kernel's gap between ncu's single launch and the timed runs (bench/NOTES.md, thirty-fifth session).
(nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 > $OUT/d2/clocks.csv 2>&1 &)
timeout 300 python3 bench/run_all.py --out $OUT/d2/record --benchmarks "grouped gemm" > $OUT/d2/record/run_all.log 2>&1; echo "record rc=$? ${SECONDS}s"
pkill -f "nvidia-smi --query-gpu" ; wc -l $OUT/d2/clocks.csv
python3 bench/plots.py $OUT/d2/record > /dev/null 2>&1
grep "grouped gemm" $OUT/d2/record/SUMMARY.md | grep -v decode | cut -d'|' -f3,4,7
cd $OUT && tar czf d2.tgz d2 && rm -rf d2
