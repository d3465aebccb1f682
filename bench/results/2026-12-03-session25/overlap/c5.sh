# Session 25 call 5: the overlapped single-warpgroup loop (tree fa58d38): GPU tests, A/B against e50f745's kernel
# (.ab3/s25/old: its kgen, templates and specs), the record, compute-sanitizer.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s25/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c5
PYTHONPATH=$NEW python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 > $OUT/c5/build.log 2>&1; tail -1 $OUT/c5/build.log
PYTHONPATH=$NEW timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_plan.py > $OUT/c5/gpu_tests_attention.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c5/gpu_tests_attention.log
for tree in OLD NEW; do
PYTHONPATH=${!tree} timeout 60 python3 tools/prefill_tile_probe.py --lengths 128,256,512,1024 --shapes wgmma:64:64,wgmma:64:80 --rounds 2 > $OUT/c5/probe_$tree.txt 2>&1; echo "probe $tree rc=$?"
done
python3 - <<'PY'
import json,collections,os
for tree in ("OLD","NEW"):
    t=collections.defaultdict(dict)
    for l in open(os.environ['OUT']+f'/c5/probe_{tree}.txt'):
        if l.startswith('{'):
            r=json.loads(l)
            if 'ms' in r: t[r['length']][r['shape']]=r['ms']
            else: print(tree, r)
    for L,d in t.items(): print(tree, L, ' '.join(f"{k.replace('wgmma:','')}={v}" for k,v in d.items()))
PY
for tool in memcheck racecheck; do
PYTHONPATH=$NEW timeout 45 compute-sanitizer --tool $tool --report-api-errors no python3 .ab3/s25/san_single.py > $OUT/c5/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -2 $OUT/c5/san_$tool.log
done
(cd $OUT && tar czf c5.tgz c5 && rm -rf c5)
PYTHONPATH=$NEW timeout 180 python3 bench/run_all.py --out $OUT/c5run --benchmarks "attention,attention sweep" > $OUT/c5run_all.log 2>&1; echo run_all rc=$?
grep -E "^\| attention \|" $OUT/c5run/SUMMARY.md | sed -E 's/\| attention \| //' | cut -c1-120
grep -E "cuDNN dense|cliff" $OUT/c5run/SUMMARY.md | sed -E 's/.*sweep L=([0-9]+).*\(([0-9.]+) vs ([0-9.]+) ms\) \| ([0-9.]+).*/\1 \2 \3 \4/;s/.*sweep cliff (t\(L=[0-9]+\)).*\| ([0-9.]+) \| x.*/\1 \2/' | tr '\n' ';'
echo
cd $OUT && tar czf c5run.tgz c5run && rm -rf c5run
