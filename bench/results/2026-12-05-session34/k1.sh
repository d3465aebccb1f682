# Session 34 call 1 (tree $1 = wip/gdn-kept, checked out; .ab3/s34/before = aee21b3, the stores of a pair a lane): build; the backward and torch.library GPU tests;
# memcheck and racecheck on the sanitizer case; each kernel's time in the GDN step; then one round of the grouped
# GEMM's clusters against single blocks at 4096 tokens. Carry [".whl", ".ab3/s34"].
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/k1
SECONDS=0
timeout 90 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt --family grouped_gemm -j 16 -q > $OUT/k1/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/k1/build.log
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py tests/test_torch_library_gpu.py > $OUT/k1/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/k1/gpu_tests.log; grep -E "^FAILED" $OUT/k1/gpu_tests.log | head
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py attention_and_gated_delta_rule > $OUT/k1/san_$tool.log 2>&1; echo "$tool rc=$? ${SECONDS}s"; tail -1 $OUT/k1/san_$tool.log; grep -m3 "Race reported" $OUT/k1/san_$tool.log
done
BEFORE=/tmp/site:$PWD/.ab3/s34/before:$PWD/tests:$PWD/bench STORES=$PYTHONPATH
for t in BEFORE STORES BEFORE STORES; do PYTHONPATH=${!t} timeout 150 python3 .ab3/s34/gdn_kernels.py $t >> $OUT/k1/gdn_kernels.jsonl 2>> $OUT/k1/err; echo "kernels $t rc=$? ${SECONDS}s"; done
python3 -c "
import json
for l in open('$OUT/k1/gdn_kernels.jsonl'):
    d = json.loads(l)
    if 'ms' in d: print(d['tree'], d['shape'], {k[:40]: v for k, v in list(d['ms'].items())[:6]})
"
[ $SECONDS -lt 440 ] && { timeout $((570 - SECONDS)) python3 tools/ab_grouped_gemm_forms.py --rounds 1 --tokens 4096 --routing balanced,zipf --forms built_in,clusters >> $OUT/k1/clusters_4096.jsonl 2>> $OUT/k1/err; echo "clusters rc=$? ${SECONDS}s"; }
cd $OUT && tar czf k1.tgz k1 && rm -rf k1
