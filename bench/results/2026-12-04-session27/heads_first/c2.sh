# Session 27 call 2: heads fastest in the blocks' order (block_work) against the tree before (old/): GPU tests, A/B.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s27/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1
mkdir -p $OUT/c2
PYTHONPATH=$NEW timeout 100 python3 -m kgen --spec-path tests/specs/neighbours build --family attention_prefill -j 16 -q > $OUT/c2/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c2/build.log
(cd .ab3/s27/old && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m kgen build --family attention_prefill -j 16 -q > $OUT/c2/build_old.log 2>&1; echo "build old rc=$?")
for round in 1 2; do for tree in OLD NEW; do
  [ $round = 2 ] && tree=$([ $tree = OLD ] && echo NEW || echo OLD)
  PYTHONPATH=${!tree} timeout 150 python3 .ab3/s27/probe_plan.py --rounds 3 > $OUT/c2/probe_${tree}_$round.txt 2>&1; echo "$tree $round rc=$?"
done; done
python3 - <<'P'
import json,os,glob
rows={}
for f in sorted(glob.glob(os.environ["OUT"]+"/c2/probe_*.txt")):
    tag=os.path.basename(f)[6:-4]
    for line in open(f):
        try: r=json.loads(line)
        except Exception: print(tag, line.rstrip()[:200]); continue
        rows.setdefault(r["case"],{})[tag]=(r["kgen"],r["cudnn"],r["ratio"])
for c,d in rows.items(): print(c, " ".join(f"{t}:{v[0]}/{v[1]}={v[2]}" for t,v in sorted(d.items())))
P
PYTHONPATH=$NEW timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_attention_gpu.py > $OUT/c2/gpu.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c2/gpu.log
cd $OUT && tar czf c2.tgz c2 && rm -rf c2
