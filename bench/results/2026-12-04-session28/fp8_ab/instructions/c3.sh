# Session 28 call 3 (tree $1): the FP8 loop's scaling as one FMA with walked scale pointers, and descriptors
# advanced by adding to their start field; against old/ (1949cd9): GPU tests, sanitizers (moe part), A/B.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s28/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c3
PYTHONPATH=$NEW timeout 60 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c3/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c3/build.log
(cd .ab3/s28/old && PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c3/build_old.log 2>&1; echo "build old rc=$?")
PYTHONPATH=$NEW timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c3/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c3/gpu_tests.log
for round in 1 2; do for tree in OLD NEW; do
  [ $round = 2 ] && tree=$([ $tree = OLD ] && echo NEW || echo OLD)
  PYTHONPATH=${!tree} timeout 60 python3 .ab3/s28/probe_gemm.py > $OUT/c3/probe_${tree}_$round.txt 2>&1; echo "$tree $round rc=$?"; cat $OUT/c3/probe_${tree}_$round.txt
done; done
for tool in memcheck racecheck; do
  PYTHONPATH=$NEW timeout 90 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c3/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c3/san_$tool.log
done
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
