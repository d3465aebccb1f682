# Session 26 call 5: packed prefill tiles (fixed guard): build, GPU tests, sanitizers, probe, the attention record.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c5
python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 > $OUT/c5/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c5/build.log; grep -i 'error\|SPILLS' $OUT/c5/build.log | head -5
timeout 100 python3 .ab3/s26/dbg.py > $OUT/c5/dbg.log 2>&1; cut -c1-120 $OUT/c5/dbg.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_plan.py > $OUT/c5/gpu_tests.log 2>&1; echo "tests rc=$?"; grep -E '^FAILED|passed|failed' $OUT/c5/gpu_tests.log | head -12 | cut -c1-250
for tool in memcheck racecheck; do
timeout 60 compute-sanitizer --tool $tool --report-api-errors no python3 .ab3/s26/san_packed.py > $OUT/c5/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -2 $OUT/c5/san_$tool.log
done
(cd $OUT && tar czf c5.tgz c5 && rm -rf c5)
timeout 200 python3 bench/run_all.py --out $OUT/c5run --benchmarks "attention,attention sweep" > $OUT/c5run_all.log 2>&1; echo run_all rc=$?
grep -E "^\| attention \|" $OUT/c5run/SUMMARY.md | sed -E 's/\| attention \| //' | cut -c1-120
grep -E "cuDNN dense|cliff" $OUT/c5run/SUMMARY.md | sed -E 's/.*sweep L=([0-9]+).*\(([0-9.]+) vs ([0-9.]+) ms\) \| ([0-9.]+).*/\1 \2 \3 \4/;s/.*sweep cliff (t\(L=[0-9]+\)).*\| ([0-9.]+) \| x.*/\1 \2/' | tr '\n' ';'
echo
cd $OUT && tar czf c5run.tgz c5run c5run_all.log && rm -rf c5run
