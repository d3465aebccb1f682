# Session 36 call 1d: skiprows = wip/gemm-skip-rows 42a0e71 (fp8ss, and in 16-bit a warpgroup whose 64 rows all
# lie past the group's end only releases the stages) against its parent fp8ss = wip/fp8-ss 9cfcaf2. A/B ABBA at
# Zipf routing (where groups' last tiles are short), bf16 and SwiGLU+FP8, both token counts; then the GPU grouped
# GEMM tests and the MoE racecheck on skiprows. About 300 s.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
FP8SS=/tmp/site:$PWD/.ab3/s36/fp8ss:$PWD/tests:$PWD/bench
SKIPROWS=/tmp/site:$PWD/.ab3/s36/skiprows:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1
mkdir -p $OUT/d1d
SECONDS=0
for t in FP8SS SKIPROWS; do PYTHONPATH=${!t} timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/d1d/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; tail -1 $OUT/d1d/build_$t.log; done
run() { PYTHONPATH=${!1} timeout 120 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --calls bf16,swiglu_fp8_out --routing zipf >> $OUT/d1d/ab_$1.jsonl 2>> $OUT/d1d/ab.err; echo "$1 rc=$? ${SECONDS}s"; }
run FP8SS; run SKIPROWS; run SKIPROWS; run FP8SS
python3 - <<'PY'
import json, os
out = os.environ["OUT"] + "/d1d/"
def load(f):
    d = {}
    for l in open(out + f):
        if l.startswith('{"round'):
            r = json.loads(l)
            for c in ("bf16", "swiglu_fp8_out"):
                if c in r: d.setdefault((r["case"], c), []).append((r[c], r["sum"][c]))
    return d
o, n = load("ab_FP8SS.jsonl"), load("ab_SKIPROWS.jsonl")
for key in o:
    a, b = [x[0] for x in o[key]], [x[0] for x in n.get(key, [])]
    print(f"{key[0]:36s} {key[1]:15s} fp8ss {a} skiprows {b} ratio {sum(b) / max(sum(a), 1e-9):.3f} same={len({x[1] for x in o[key] + n.get(key, [])}) == 1}")
PY
PYTHONPATH=$SKIPROWS timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/d1d/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/d1d/gpu_tests.log; grep -E "^FAILED" $OUT/d1d/gpu_tests.log | head
[ $SECONDS -lt 540 ] && { PYTHONPATH=$SKIPROWS timeout $((590 - SECONDS)) compute-sanitizer --tool racecheck --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/d1d/san_moe_racecheck.log 2>&1; echo "moe racecheck rc=$? ${SECONDS}s"; tail -1 $OUT/d1d/san_moe_racecheck.log; }
tail -3 $OUT/d1d/ab.err
cd $OUT && tar czf d1d.tgz d1d && rm -rf d1d
