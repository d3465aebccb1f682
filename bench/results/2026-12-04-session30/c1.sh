# Session 30 call 1 (tree $1): grouped GEMM GPU tests over every form (four stages added), then an A/B of three
# trees: old/ (HEAD d53fb31), new/ (64-column epilogue passes + FP8 scales loaded a K block ahead), and the
# checkout (those + FP8 products in 64-column chunks, two part accumulators), with the checkout's four-stage form.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
CHUNKS=/tmp/site:$PWD:$PWD/tests:$PWD/bench
NEW=/tmp/site:$PWD/.ab3/s30/new:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s30/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1
SECONDS=0
PYTHONPATH=$CHUNKS timeout 120 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c1/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c1/build.log
PYTHONPATH=$CHUNKS timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c1/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -3 $OUT/c1/gpu_tests.log; grep -E "^FAILED|Error" $OUT/c1/gpu_tests.log | head -10
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms $2 >> $OUT/c1/ab_$1.jsonl 2>> $OUT/c1/ab.err; echo "$1 $2 rc=$? ${SECONDS}s"; }
run OLD built_in; run NEW built_in; run CHUNKS built_in,four_stages
run CHUNKS four_stages,built_in; run NEW built_in; run OLD built_in
grep kgen $OUT/c1/ab_*.jsonl
tail -3 $OUT/c1/ab.err
for tool in memcheck racecheck; do
  [ $SECONDS -gt 420 ] && break
  PYTHONPATH=$CHUNKS timeout 120 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c1/san_$tool.log 2>&1; echo "$tool rc=$? ${SECONDS}s"; tail -1 $OUT/c1/san_$tool.log
done
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
