# Session 36 call 1b (right after d1.sh): fp8ss = wip/fp8-ss 9cfcaf2 (both, with FP8's A from shared memory and the
# skew in FP8 too). FP8 A/B ABBA of old and fp8ss, balanced; main's GPU grouped GEMM tests and the MoE sanitizers
# on fp8ss (it holds every change). About 250 s.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
OLD=/tmp/site:$PWD/.ab3/s36/old:$PWD/tests:$PWD/bench
FP8SS=/tmp/site:$PWD/.ab3/s36/fp8ss:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1
mkdir -p $OUT/d1b
SECONDS=0
for t in OLD FP8SS; do PYTHONPATH=${!t} timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/d1b/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; tail -1 $OUT/d1b/build_$t.log; done
fp8() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --calls fp8 --routing balanced >> $OUT/d1b/fp8_$1.jsonl 2>> $OUT/d1b/ab.err; echo "fp8 $1 rc=$? ${SECONDS}s"; }
fp8 OLD; fp8 FP8SS; fp8 FP8SS; fp8 OLD
python3 - <<'PY'
import json, os
out = os.environ["OUT"] + "/d1b/"
def fp8(f):
    d = {}
    for l in open(out + f):
        if l.startswith('{"round'):
            r = json.loads(l)
            d.setdefault(r["case"], []).append((r["fp8"], r["sum"]["fp8"]))
    return d
o, n = fp8("fp8_OLD.jsonl"), fp8("fp8_FP8SS.jsonl")
for case in o:
    a, b = [x[0] for x in o[case]], [x[0] for x in n.get(case, [])]
    print(f"FP8 {case:36s} old {a} fp8ss {b} ratio {sum(b) / max(sum(a), 1e-9):.3f} same={len({x[1] for x in o[case] + n.get(case, [])}) == 1}")
PY
PYTHONPATH=$FP8SS timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py tests/test_grouped_gemm_fp8_gpu.py > $OUT/d1b/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/d1b/gpu_tests.log; grep -E "^FAILED" $OUT/d1b/gpu_tests.log | head
for tool in racecheck memcheck; do
  [ $SECONDS -gt 540 ] && break
  PYTHONPATH=$FP8SS timeout $((590 - SECONDS)) compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/d1b/san_moe_$tool.log 2>&1; echo "moe $tool rc=$? ${SECONDS}s"; tail -1 $OUT/d1b/san_moe_$tool.log
done
tail -3 $OUT/d1b/ab.err
cd $OUT && tar czf d1b.tgz d1b && rm -rf d1b
