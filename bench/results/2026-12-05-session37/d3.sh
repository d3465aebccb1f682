# Session 37, if time is left after d2: what kgen's FP8 main loop makes without the two-level promotion (probe = main's
# kernels with FP8 accumulated in the tensor core across K and never promoted: timing only, wrong results), against
# old (main's kernels), each beside torch's scaled grouped GEMM in the same process; balanced prefill shapes, ABBA
# over processes. About 250 s. If the probe reaches torch's rate, the FP8 gap to torch is the promotion (work
# torch's row-wise recipe does not do); if not, it is the main loop.
SECONDS=0; DIR=$OUT/d3; source .ab3/s36/lib.sh
build old probe
for t in old probe probe old; do
  PYTHONPATH=$(tree $t) timeout 120 python3 .ab3/s36/probe_vs_torch.py >> $DIR/probe_$t.jsonl 2>> $DIR/probe.err
  echo "$t rc=$? ${SECONDS}s"
done
tail -3 $DIR/probe.err
python3 - "$DIR" <<'PY'
import json, sys
from collections import defaultdict
rows = defaultdict(lambda: defaultdict(list))
for tree in ("old", "probe"):
    for line in open(f"{sys.argv[1]}/probe_{tree}.jsonl"):
        r = json.loads(line)
        if "case" not in r:
            print(tree, r["kgen"]); continue
        rows[r["case"]][tree].append((r["fp8_tflops"], r["scaled_tflops"]))
for case, trees in rows.items():
    cells = [f"{tree} {sum(k for k, _ in v) / len(v):6.0f} (torch {sum(t or 0 for _, t in v) / len(v):5.0f})" for tree, v in trees.items()]
    print(f"{case:38s}", "  ".join(cells))
PY
cd $OUT && tar czf d3.tgz d3 && rm -rf d3
