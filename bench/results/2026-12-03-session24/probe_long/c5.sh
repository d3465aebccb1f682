# Session 24 call 5: tile probe at longer lengths and wider 64-row key tiles (three blocks an SM).
export PYTHONPATH=$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c5
KGEN_SPEC_PATH=<folder holding spec_used.yaml> timeout 400 python3 tools/prefill_tile_probe.py --lengths 65,96,127,128,129,192,511,512,1023,1024,2047,2048 --shapes wgmma:64:64,wgmma:64:80,wgmma:64:96,wgmma:128:128,wgmma:128:160 --rounds 2 > $OUT/c5/probe_long.txt 2>&1; echo "rc=$?"
python3 - <<'P'
import json,os
rows={}
for l in open(os.environ["OUT"]+"/c5/probe_long.txt"):
    if l.startswith("{"):
        r=json.loads(l); rows.setdefault(r["length"],{})[r["shape"]]=r.get("ms")
for L,d in rows.items(): print(L, " ".join(f"{k}={v}" for k,v in d.items()))
P
