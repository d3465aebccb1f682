# Session 27 call 1: chained work items (items_per_block) on the single warpgroup: build, GPU tests, sanitizers, probe.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c1
timeout 120 python3 -m kgen --spec-path tests/specs/neighbours build --family attention_prefill -j 16 -q > $OUT/c1/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c1/build.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_plan.py tests/test_neighbour_variants_gpu.py > $OUT/c1/gpu.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/c1/gpu.log
for tool in memcheck racecheck; do
timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 .ab3/s27/san_chain.py > $OUT/c1/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c1/san_$tool.log
done
timeout 150 python3 .ab3/s27/probe_chain.py --rounds 3 > $OUT/c1/probe.txt 2>&1; echo "probe rc=$?"
python3 - <<'P'
import json,os
for line in open(os.environ["OUT"]+"/c1/probe.txt"):
    try: r=json.loads(line)
    except Exception: print(line.rstrip()[:200]); continue
    print(r["case"], {k:v for k,v in r.items() if k not in ("case","info")}, r["info"].get("bitwise_as_k1"), r["info"].get("check",""))
P
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
