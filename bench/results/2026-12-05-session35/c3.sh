# Session 35 call 3 (tree $1): the 16-bit consumer warpgroups skewed by two K steps. Build, A/B ABBA of trees
# (old/ = main 5b70cee) in bf16 and the fused SwiGLU+FP8, balanced and Zipf; GPU tests; MoE sanitizers; the record.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s35/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c3/record
SECONDS=0
PYTHONPATH=$NEW timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/c3/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c3/build.log
PYTHONPATH=$OLD timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/c3/build_old.log 2>&1; echo "build old rc=$? ${SECONDS}s"
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --calls bf16,swiglu_fp8_out --routing balanced,zipf >> $OUT/c3/ab_$1.jsonl 2>> $OUT/c3/ab.err; echo "$1 rc=$? ${SECONDS}s"; }
run OLD; run NEW; run NEW; run OLD
python3 - <<'PY'
import json, os
out = os.environ["OUT"] + "/c3/"
def load(f):
    d = {}
    for l in open(out + f):
        if l.startswith('{"round'):
            r = json.loads(l)
            for c in ("bf16", "swiglu_fp8_out"):
                if c in r: d.setdefault((r["case"], c), []).append((r[c], r["sum"][c]))
    return d
o, n = load("ab_OLD.jsonl"), load("ab_NEW.jsonl")
for key in o:
    a, b = [x[0] for x in o[key]], [x[0] for x in n.get(key, [])]
    same = len({x[1] for x in o[key] + n.get(key, [])}) == 1
    print(f"{key[0]:36s} {key[1]:15s} old {a} new {b} ratio {sum(b)/max(sum(a),1e-9):.3f} same={same}")
PY
PYTHONPATH=$NEW timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py tests/test_grouped_gemm_fp8_gpu.py > $OUT/c3/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c3/gpu_tests.log; grep -E "^FAILED" $OUT/c3/gpu_tests.log | head
for tool in racecheck memcheck; do
  PYTHONPATH=$NEW timeout 120 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c3/san_moe_$tool.log 2>&1; echo "moe $tool rc=$? ${SECONDS}s"; tail -1 $OUT/c3/san_moe_$tool.log
done
[ $SECONDS -lt 480 ] && { PYTHONPATH=$NEW timeout $((590 - SECONDS)) python3 bench/run_all.py --out $OUT/c3/record --benchmarks "grouped gemm" > $OUT/c3/record/run_all.log 2>&1; echo "record rc=$? ${SECONDS}s"; python3 bench/plots.py $OUT/c3/record > /dev/null 2>&1; grep "grouped gemm" $OUT/c3/record/SUMMARY.md | grep -v decode | cut -d'|' -f3,4,7; }
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
