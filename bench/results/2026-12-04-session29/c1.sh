# Session 29 call 1 (tree $1): the grouped GEMM GPU tests over every form (built-in, wide FP8, clusters), both sanitizers on the moe case.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1
timeout 90 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c1/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c1/build.log
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c1/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -15 $OUT/c1/gpu_tests.log
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c1/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -3 $OUT/c1/san_$tool.log
done
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
