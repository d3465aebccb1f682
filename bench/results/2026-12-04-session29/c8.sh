# Session 29 call 8 (tree $1): the GDN gradients kernel per q/k head (GVA summed inside): backward GPU tests,
# per-kernel profile, sanitizers (attention and GDN part). (No old/ tree: on the device PYTHONPATH does not
# override the checkout's kgen, see bench/NOTES.md twenty-ninth session.)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c8
timeout 120 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/c8/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c8/build.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py > $OUT/c8/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -4 $OUT/c8/gpu_tests.log
timeout 100 python3 .ab3/s29/prof_gdn.py > $OUT/c8/prof.txt 2>&1; echo "prof rc=$?"; grep -v Warn $OUT/c8/prof.txt | grep -v _warn
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py attention_and_gated_delta_rule > $OUT/c8/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c8/san_$tool.log
done
cd $OUT && tar czf c8.tgz c8 && rm -rf c8
