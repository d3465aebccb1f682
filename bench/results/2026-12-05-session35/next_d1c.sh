# Session 36 call 1c: paired = wip/gemm-paired 2d1a686 (main's kernels, K steps loaded in pairs so that both steps'
# requests for the same rows of b leave together). A/B ABBA of old and paired at the 4096-token shapes (weights
# streamed from DRAM), bf16, SwiGLU+FP8 and FP8, balanced and Zipf; then the GPU grouped GEMM tests and the MoE
# racecheck on paired. About 300 s.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
OLD=/tmp/site:$PWD/.ab3/s36/old:$PWD/tests:$PWD/bench
PAIRED=/tmp/site:$PWD/.ab3/s36/paired:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1
mkdir -p $OUT/d1c
SECONDS=0
for t in OLD PAIRED; do PYTHONPATH=${!t} timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/d1c/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; tail -1 $OUT/d1c/build_$t.log; done
run() { PYTHONPATH=${!1} timeout 120 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --tokens 4096 --routing balanced,zipf >> $OUT/d1c/ab_$1.jsonl 2>> $OUT/d1c/ab.err; echo "$1 rc=$? ${SECONDS}s"; }
run OLD; run PAIRED; run PAIRED; run OLD
python3 - <<'PY'
import json, os
out = os.environ["OUT"] + "/d1c/"
def load(f):
    d = {}
    for l in open(out + f):
        if l.startswith('{"round'):
            r = json.loads(l)
            for c in ("bf16", "fp8", "swiglu_fp8_out"):
                if c in r: d.setdefault((r["case"], c), []).append((r[c], r["sum"][c]))
    return d
o, n = load("ab_OLD.jsonl"), load("ab_PAIRED.jsonl")
for key in o:
    a, b = [x[0] for x in o[key]], [x[0] for x in n.get(key, [])]
    print(f"{key[0]:36s} {key[1]:15s} old {a} paired {b} ratio {sum(b) / max(sum(a), 1e-9):.3f} same={len({x[1] for x in o[key] + n.get(key, [])}) == 1}")
PY
PYTHONPATH=$PAIRED timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py tests/test_grouped_gemm_fp8_gpu.py > $OUT/d1c/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/d1c/gpu_tests.log; grep -E "^FAILED" $OUT/d1c/gpu_tests.log | head
[ $SECONDS -lt 540 ] && { PYTHONPATH=$PAIRED timeout $((590 - SECONDS)) compute-sanitizer --tool racecheck --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/d1c/san_moe_racecheck.log 2>&1; echo "moe racecheck rc=$? ${SECONDS}s"; tail -1 $OUT/d1c/san_moe_racecheck.log; }
tail -3 $OUT/d1c/ab.err
cd $OUT && tar czf d1c.tgz d1c && rm -rf d1c
