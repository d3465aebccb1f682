# Session 25 call 2: each tile shape under the sequence-grouped order, then the benchmarks' record.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c2
python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 > $OUT/c2/build.log 2>&1; tail -1 $OUT/c2/build.log
timeout 300 python3 tools/prefill_tile_probe.py --lengths 65,96,128,129,160,192,256,257,384,512,513,1024,1025,2048,2049 --shapes wgmma:64:64,wgmma:64:80,wgmma:64:96,wgmma:128:128,wgmma:128:160 --rounds 2 > $OUT/c2/probe_shapes.txt 2>&1; echo probe rc=$?
python3 - <<'PY'
import json,collections,os
rows=[json.loads(l) for l in open(os.environ['OUT']+'/c2/probe_shapes.txt') if l.startswith('{')]
t=collections.defaultdict(dict)
for r in rows:
    if 'ms' in r: t[r['length']][r['shape']]=r['ms']
    elif 'error' in r: print(r)
for L,d in t.items(): print(L, ' '.join(f"{k.replace('wgmma:','')}={v}" for k,v in d.items()))
PY
timeout 280 python3 bench/run_all.py --out $OUT/c2/run --benchmarks "attention,attention sweep" > $OUT/c2/run_all.log 2>&1; echo run_all rc=$?
grep -E "^\| attention \|" $OUT/c2/run/SUMMARY.md | sed -E 's/\| attention \| //' | cut -c1-120
grep -E "cuDNN dense|cliff" $OUT/c2/run/SUMMARY.md | sed -E 's/.*sweep L=([0-9]+).*\(([0-9.]+) vs ([0-9.]+) ms\) \| ([0-9.]+).*/\1 \2 \3 \4/;s/.*sweep cliff (t\(L=[0-9]+\)).*\| ([0-9.]+) \| x.*/\1 \2/' | tr '\n' ';'
cd $OUT && tar czf c2.tgz c2 && rm -rf c2
