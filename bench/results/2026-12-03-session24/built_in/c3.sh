# Session 24 call 3: step 2b in the built-in spec: neighbours build, GPU tests, sanitizer on the new neighbours.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c3
(python3 -m kgen build --family attention_prefill -j 16 && KGEN_SPEC_PATH=tests/specs/neighbours python3 -m kgen build --family attention_prefill -j 16) > $OUT/c3/build.log 2>&1; echo "build rc=$?"; tail -4 $OUT/c3/build.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_neighbour_variants_gpu.py > $OUT/c3/gpu_tests_neighbours.log 2>&1; echo "nb rc=$?"; tail -3 $OUT/c3/gpu_tests_neighbours.log
for t in memcheck racecheck; do
timeout 150 compute-sanitizer --tool $t --report-api-errors no python3 -m pytest -q -m gpu -p no:cacheprovider $(cat .ab3/s24/nb_ids.txt) > $OUT/c3/san_neighbours_$t.log 2>&1; echo "$t rc=$?"; tail -3 $OUT/c3/san_neighbours_$t.log
done
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_inputs.py > $OUT/c3/gpu_tests_attention.log 2>&1; echo "attn rc=$?"; tail -3 $OUT/c3/gpu_tests_attention.log
