# Session 30 call 5 (tree $1): the TMA-store epilogue: grouped GEMM GPU tests, sanitizers, A/B against prev/ (d8c56bf).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
PREV=/tmp/site:$PWD/.ab3/s30/prev:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c5
SECONDS=0
PYTHONPATH=$NEW timeout 90 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c5/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c5/build.log
PYTHONPATH=$NEW timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c5/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c5/gpu_tests.log; grep -E "^FAILED" $OUT/c5/gpu_tests.log | head
for tool in memcheck racecheck; do
  PYTHONPATH=$NEW timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c5/san_$tool.log 2>&1; echo "$tool rc=$? ${SECONDS}s"; tail -1 $OUT/c5/san_$tool.log
done
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --routing balanced >> $OUT/c5/ab_$1.jsonl 2>> $OUT/c5/ab.err; echo "$1 rc=$? ${SECONDS}s"; }
run PREV; run NEW; run NEW; run PREV
grep kgen $OUT/c5/ab_*.jsonl; tail -2 $OUT/c5/ab.err
cd $OUT && tar czf c5.tgz c5 && rm -rf c5
