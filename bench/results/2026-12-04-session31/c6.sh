# Session 31 call 6 (tree $1): L2 prefetch of the K steps past the stages, four at a time, against old/ = d9e8e84:
# grouped GEMM GPU tests, A/B (ABBA over processes, balanced routing), both sanitizers on the MoE case.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s31/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c6
SECONDS=0
for t in NEW OLD; do PYTHONPATH=${!t} timeout 100 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c6/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; done
PYTHONPATH=$NEW timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c6/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c6/gpu_tests.log; grep -E "^FAILED" $OUT/c6/gpu_tests.log | head -3
run() { PYTHONPATH=${!1} timeout 60 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --routing $2 >> $OUT/c6/ab_$1.jsonl 2>> $OUT/c6/ab.err; echo "$1 $2 rc=$? ${SECONDS}s"; }
run OLD balanced; run NEW balanced; run NEW balanced; run OLD balanced
for tool in memcheck racecheck; do
  [ $SECONDS -gt 200 ] && break
  PYTHONPATH=$NEW timeout 40 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c6/san_moe_$tool.log 2>&1; echo "moe $tool rc=$? ${SECONDS}s"; tail -1 $OUT/c6/san_moe_$tool.log
done
cd $OUT && tar czf c6.tgz c6 && rm -rf c6
