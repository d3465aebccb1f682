# Session 35 call 1 (tree $1): FP8 warpgroups taking turns. Build, FP8 GPU tests, MoE sanitizers, then FP8 A/B
# ABBA of trees (old/ = main 5b70cee) and the FP8 forms (narrow, cluster) against the built-in in the new tree.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s35/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1
SECONDS=0
PYTHONPATH=$NEW timeout 100 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c1/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c1/build.log
PYTHONPATH=$OLD timeout 100 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c1/build_old.log 2>&1; echo "build old rc=$? ${SECONDS}s"
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --calls fp8 --routing $2 >> $OUT/c1/ab_$1.jsonl 2>> $OUT/c1/ab.err; echo "$1 $2 rc=$? ${SECONDS}s"; }
run OLD balanced; run NEW balanced; run NEW balanced; run OLD balanced
PYTHONPATH=$NEW timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py > $OUT/c1/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c1/gpu_tests.log; grep -E "^FAILED" $OUT/c1/gpu_tests.log | head
for tool in racecheck memcheck; do
  PYTHONPATH=$NEW timeout 120 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c1/san_moe_$tool.log 2>&1; echo "moe $tool rc=$? ${SECONDS}s"; tail -1 $OUT/c1/san_moe_$tool.log
done
[ $SECONDS -lt 420 ] && { PYTHONPATH=$NEW timeout $((560 - SECONDS)) python3 tools/ab_grouped_gemm_forms.py --rounds 2 --forms built_in,fp8_narrow,narrow6,fp8_cluster --folder narrow6=.ab3/s35/narrow6 --calls fp8 --routing balanced > $OUT/c1/forms.jsonl 2>> $OUT/c1/ab.err; echo "forms rc=$? ${SECONDS}s"; }
tail -3 $OUT/c1/ab.err
python3 - <<'PY'
import json, os
out = os.environ["OUT"] + "/c1/"
def load(f):
    rows = [json.loads(l) for l in open(out + f) if l.startswith('{"round')]
    d = {}
    for r in rows: d.setdefault((r["case"], r["form"]), []).append(r["fp8"])
    return d
o, n = load("ab_OLD.jsonl"), load("ab_NEW.jsonl")
for key in o:
    print(f"{key[0]:40s} old {o[key]} new {n.get(key)} ratio {sum(n.get(key,[0]))/sum(o[key]):.3f}")
if os.path.exists(out + "forms.jsonl"):
    for key, v in load("forms.jsonl").items(): print(key, v)
PY
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
