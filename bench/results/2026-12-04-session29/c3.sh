# Session 29 call 3 (tree $1): grouped GEMM GPU tests over every form, sanitizers, then the record and the forms A/B.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c3/record
timeout 90 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c3/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c3/build.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c3/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/c3/gpu_tests.log
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c3/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c3/san_$tool.log
done
timeout 200 python3 bench/run_all.py --out $OUT/c3/record --benchmarks "grouped gemm" > $OUT/c3/record/run_all.log 2>&1; echo "record rc=$?"
python3 bench/plots.py $OUT/c3/record > /dev/null 2>&1
grep "grouped gemm" $OUT/c3/record/SUMMARY.md | cut -d'|' -f3,4,7
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
