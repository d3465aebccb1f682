# Session 26 call 2: packed prefill tiles (b4871a8): build, GPU tests, sanitizers, probe against per-sequence and cuDNN.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c2
python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 > $OUT/c2/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c2/build.log; grep -i 'error\|spill' $OUT/c2/build.log | head -5
timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_attention_gpu.py -k packed > $OUT/c2/gpu_packed.log 2>&1; echo "packed tests rc=$?"; tail -25 $OUT/c2/gpu_packed.log | cut -c1-300
timeout 100 python3 .ab3/s26/probe_packed.py > $OUT/c2/probe.txt 2>&1; echo "probe rc=$?"; cut -c1-400 $OUT/c2/probe.txt
for tool in memcheck racecheck; do
timeout 60 compute-sanitizer --tool $tool --report-api-errors no python3 .ab3/s26/san_packed.py > $OUT/c2/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -3 $OUT/c2/san_$tool.log
done
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_plan.py -k "not packed" > $OUT/c2/gpu_rest.log 2>&1; echo "rest tests rc=$?"; tail -4 $OUT/c2/gpu_rest.log | cut -c1-300
(cd $OUT && tar czf c2.tgz c2 && rm -rf c2)
