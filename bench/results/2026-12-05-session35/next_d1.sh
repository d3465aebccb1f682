# Session 36 call 1 (run from main's checkout; trees in .ab3/s36: old = main's kernels (5b70cee's template),
# skew = wip/gemm-skew 01cc8f1 (16-bit warpgroups two K steps apart), both = wip/gemm-both 5dfb181 (skew and the
# SwiGLU epilogue's __fdividef)). Builds; A/B ABCCBA over processes in bf16 and the fused SwiGLU+FP8, balanced and
# Zipf. About 400 s. Then d1b.sh at once (the machine stays warm 30 s).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
OLD=/tmp/site:$PWD/.ab3/s36/old:$PWD/tests:$PWD/bench
SKEW=/tmp/site:$PWD/.ab3/s36/skew:$PWD/tests:$PWD/bench
BOTH=/tmp/site:$PWD/.ab3/s36/both:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1
mkdir -p $OUT/d1
SECONDS=0
for t in OLD SKEW BOTH; do PYTHONPATH=${!t} timeout 100 python3 -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $OUT/d1/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; tail -1 $OUT/d1/build_$t.log; done
run() { PYTHONPATH=${!1} timeout 120 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --calls bf16,swiglu_fp8_out --routing balanced,zipf >> $OUT/d1/ab_$1.jsonl 2>> $OUT/d1/ab.err; echo "$1 rc=$? ${SECONDS}s"; }
run OLD; run SKEW; run BOTH; run BOTH; run SKEW; run OLD
python3 - <<'PY'
import json, os
out = os.environ["OUT"] + "/d1/"
def load(f):
    d = {}
    for l in open(out + f):
        if l.startswith('{"round'):
            r = json.loads(l)
            for c in ("bf16", "swiglu_fp8_out"):
                if c in r: d.setdefault((r["case"], c), []).append((r[c], r["sum"][c]))
    return d
o, s, b = load("ab_OLD.jsonl"), load("ab_SKEW.jsonl"), load("ab_BOTH.jsonl")
mean = lambda d, key: sum(x[0] for x in d.get(key, [])) / max(len(d.get(key, [])), 1)
for key in o:
    print(f"{key[0]:36s} {key[1]:15s} old {mean(o, key):6.1f} skew {mean(s, key) / mean(o, key):.3f} "
          f"both {mean(b, key) / mean(o, key):.3f} skew_same={len({x[1] for x in o[key] + s.get(key, [])}) == 1}")
PY
tail -3 $OUT/d1/ab.err
cd $OUT && tar czf d1.tgz d1 && rm -rf d1
