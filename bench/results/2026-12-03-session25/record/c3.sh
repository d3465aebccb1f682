# Session 25 call 3: the grouped order with 64-row tiles chosen from 192 to 1025 tokens: GPU tests, a probe in reversed shape order, the record.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c3
python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 > $OUT/c3/build.log 2>&1; tail -1 $OUT/c3/build.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_plan.py > $OUT/c3/gpu_tests_attention.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c3/gpu_tests_attention.log
timeout 100 python3 tools/prefill_tile_probe.py --lengths 1024,2048,2049 --shapes wgmma:128:160,wgmma:128:128,wgmma:64:96,wgmma:64:64 --rounds 2 > $OUT/c3/probe_reversed.txt 2>&1; echo "probe rc=$?"
python3 - <<'PY'
import json,collections,os
rows=[json.loads(l) for l in open(os.environ['OUT']+'/c3/probe_reversed.txt') if l.startswith('{')]
t=collections.defaultdict(dict)
for r in rows:
    if 'ms' in r: t[r['length']][r['shape']]=r['ms']
for L,d in t.items(): print(L, ' '.join(f"{k.replace('wgmma:','')}={v}" for k,v in d.items()))
PY
timeout 280 python3 bench/run_all.py --out $OUT/c3/run --benchmarks "attention,attention sweep" > $OUT/c3/run_all.log 2>&1; echo run_all rc=$?
grep -E "^\| attention \|" $OUT/c3/run/SUMMARY.md | sed -E 's/\| attention \| //' | cut -c1-120
grep -E "cuDNN dense|cliff" $OUT/c3/run/SUMMARY.md | sed -E 's/.*sweep L=([0-9]+).*\(([0-9.]+) vs ([0-9.]+) ms\) \| ([0-9.]+).*/\1 \2 \3 \4/;s/.*sweep cliff (t\(L=[0-9]+\)).*\| ([0-9.]+) \| x.*/\1 \2/' | tr '\n' ';'
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
