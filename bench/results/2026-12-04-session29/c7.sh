# Session 29 call 7 (tree $1): the GDN per-chunk gradients kernel on wgmma against old/ (3bae13d): backward GPU tests, profile ABAB, sanitizers.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s29/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c7
PYTHONPATH=$NEW timeout 120 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/c7/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c7/build.log
(cd .ab3/s29/old && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/c7/build_old.log 2>&1; echo "build old rc=$?")
PYTHONPATH=$NEW timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py > $OUT/c7/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -4 $OUT/c7/gpu_tests.log
for round in 1 2; do for tree in OLD NEW; do
  PYTHONPATH=${!tree} timeout 60 python3 .ab3/s29/prof_gdn.py 1x32768x16x32 8x1024x16x32 > $OUT/c7/prof_${tree}_$round.txt 2>&1; echo "$tree $round rc=$?"; grep -E "==|grads" $OUT/c7/prof_${tree}_$round.txt
done; done
for tool in memcheck racecheck; do
  PYTHONPATH=$NEW timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py attention_and_gated_delta_rule > $OUT/c7/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c7/san_$tool.log
done
cd $OUT && tar czf c7.tgz c7 && rm -rf c7
