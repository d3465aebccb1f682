# Session 25 call 1: the short-sequence work order (SHORT_SEQUENCE_KEY_TILES), measured.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c1
python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 > $OUT/c1/build.log 2>&1; tail -2 $OUT/c1/build.log
timeout 200 python3 tools/prefill_tile_probe.py --short-key-tiles 0,2,4,8 --lengths 128,256,512,1024 --shapes wgmma:64:64,wgmma:128:128 --rounds 2 > $OUT/c1/probe_order.txt 2>&1; echo probe rc=$?
python3 - <<'PY'
import json,collections
rows=[json.loads(l) for l in open(__import__('os').environ['OUT']+'/c1/probe_order.txt') if l.startswith('{')]
t=collections.defaultdict(dict)
for r in rows:
    if 'ms' in r: t[r['length']][r['shape']]=r['ms']
for L,d in t.items(): print(L, ' '.join(f"{k}={v}" for k,v in d.items()))
PY
for L in 128; do
timeout 60 ncu --profile-from-start off --kernel-name regex:attention_prefill --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics dram__bytes.sum,lts__t_sector_hit_rate.pct python3 bench/results/2026-12-03-session24/ncu/ncu_case.py $L > $OUT/c1/ncu_L$L.txt 2>&1; echo "L=$L rc=$?"
done
grep -h -E "Duration|DRAM Throughput|dram__bytes|hit_rate" $OUT/c1/ncu_L*.txt | cut -c1-150
timeout 300 python3 bench/run_all.py --out $OUT/c1/run --benchmarks "attention,attention sweep" > $OUT/c1/run_all.log 2>&1; echo run_all rc=$?
cat $OUT/c1/run/SUMMARY.md 2>/dev/null | head -80
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
