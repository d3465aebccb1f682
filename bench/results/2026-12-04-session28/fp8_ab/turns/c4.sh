# Session 28 call 4 (tree $1): FP8 consumer warpgroups take turns issuing (named barriers), against mid/ (HEAD): FP8 GPU tests, sanitizers (moe part), A/B.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
MID=/tmp/site:$PWD/.ab3/s28/mid:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c4
PYTHONPATH=$NEW timeout 60 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c4/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c4/build.log
(cd .ab3/s28/mid && PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c4/build_old.log 2>&1; echo "build old rc=$?")
PYTHONPATH=$NEW timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py > $OUT/c4/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c4/gpu_tests.log
for round in 1 2; do for tree in MID NEW; do
  [ $round = 2 ] && tree=$([ $tree = MID ] && echo NEW || echo MID)
  PYTHONPATH=${!tree} timeout 60 python3 .ab3/s28/probe_gemm.py > $OUT/c4/probe_${tree}_$round.txt 2>&1; echo "$tree $round rc=$?"; cat $OUT/c4/probe_${tree}_$round.txt
done; done
for tool in memcheck racecheck; do
  PYTHONPATH=$NEW timeout 90 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c4/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c4/san_$tool.log
done
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
