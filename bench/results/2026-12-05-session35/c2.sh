# Session 35 call 2 (tree $1): the grouped GEMM record (peers in the same run), then ncu source counters of the FP8
# kernel at Qwen3-MoE gate+up 32768 balanced.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c2/record
SECONDS=0
timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/c2/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c2/build.log
timeout 200 python3 bench/run_all.py --out $OUT/c2/record --benchmarks "grouped gemm" > $OUT/c2/record/run_all.log 2>&1; echo "record rc=$? ${SECONDS}s"
python3 bench/plots.py $OUT/c2/record > /dev/null 2>&1
grep "grouped gemm" $OUT/c2/record/SUMMARY.md | cut -d'|' -f3,4,7
timeout 240 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SchedulerStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
   -k regex:grouped_gemm --launch-skip 1 --launch-count 1 -o $OUT/c2/fp8 python3 .ab3/s35/ncu_fp8.py > $OUT/c2/fp8.log 2>&1
echo "ncu rc=$? ${SECONDS}s"; tail -2 $OUT/c2/fp8.log
ncu --import $OUT/c2/fp8.ncu-rep --page source --csv --print-source sass > $OUT/c2/fp8_sass.csv 2> $OUT/c2/fp8_sass.err
ncu --import $OUT/c2/fp8.ncu-rep --page details > $OUT/c2/fp8_details.txt 2>&1
grep -E "Throughput|Pipe|Issue Slots|Eligible|Active Warps|Duration|SM Frequency" $OUT/c2/fp8_details.txt | head -30
cd $OUT && mkdir reps && mv c2/*.ncu-rep reps/ && tar czf c2.tgz c2 && tar czf reps.tgz reps && rm -rf c2 reps
