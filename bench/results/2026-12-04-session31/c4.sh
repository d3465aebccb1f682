# Session 31 call 4 (tree $1): the TMA-store epilogue on the scheduler warp: grouped GEMM GPU tests, A/B against
# old/ = d488548 (ABBA over processes, balanced then Zipf routing), both sanitizers on the MoE case, ncu source
# counters at DeepSeek-V3 down 32768, then the record of this tree.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s31/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c4/record
SECONDS=0
PYTHONPATH=$NEW timeout 100 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c4/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c4/build.log
PYTHONPATH=$NEW timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c4/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c4/gpu_tests.log; grep -E "^FAILED" $OUT/c4/gpu_tests.log | head
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --routing $2 >> $OUT/c4/ab_$1.jsonl 2>> $OUT/c4/ab.err; echo "$1 $2 rc=$? ${SECONDS}s"; }
run OLD balanced; run NEW balanced; run NEW balanced; run OLD balanced
run OLD zipf; run NEW zipf; run NEW zipf; run OLD zipf
for tool in memcheck racecheck; do
  PYTHONPATH=$NEW timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c4/san_moe_$tool.log 2>&1; echo "moe $tool rc=$? ${SECONDS}s"; tail -1 $OUT/c4/san_moe_$tool.log
done
PYTHONPATH=$NEW timeout 100 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
   -k regex:grouped_gemm --launch-skip 1 --launch-count 1 -o $OUT/c4/gemm python3 .ab3/s31/ncu_src.py gemm > $OUT/c4/ncu.log 2>&1; echo "ncu rc=$? ${SECONDS}s"
ncu --import $OUT/c4/gemm.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/c4/gemm_sass.csv.gz
ncu --import $OUT/c4/gemm.ncu-rep --page details > $OUT/c4/gemm_details.txt 2>&1; rm -f $OUT/c4/gemm.ncu-rep
PYTHONPATH=$NEW timeout $((585 - SECONDS)) python3 bench/run_all.py --out $OUT/c4/record --benchmarks "grouped gemm" > $OUT/c4/record/run_all.log 2>&1; echo "record rc=$? ${SECONDS}s"
PYTHONPATH=$NEW python3 bench/plots.py $OUT/c4/record > /dev/null 2>&1
tail -3 $OUT/c4/ab.err
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
