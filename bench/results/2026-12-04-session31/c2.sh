# Session 31 call 2 (tree $1): the grouped GEMM's scheduler warp and the GDN gradients kernel's batched
# read-modify-writes: GPU tests, both sanitizers, then ABBA A/Bs against old/ (HEAD c21785a).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s31/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c2
SECONDS=0
PYTHONPATH=$NEW timeout 100 python3 -m kgen build --family grouped_gemm --family gated_delta_rule_chunk -j 16 -q > $OUT/c2/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c2/build.log
PYTHONPATH=$NEW timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py tests/test_gdn_chunk_backward_gpu.py > $OUT/c2/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c2/gpu_tests.log; grep -E "^FAILED" $OUT/c2/gpu_tests.log | head
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --routing $2 >> $OUT/c2/ab_$1.jsonl 2>> $OUT/c2/ab.err; echo "$1 $2 rc=$? ${SECONDS}s"; }
run OLD balanced; run NEW balanced; run NEW balanced; run OLD balanced
gdn() { PYTHONPATH=${!1} timeout 60 python3 .ab3/s31/gdn_ab.py $1 >> $OUT/c2/gdn_ab.jsonl 2>> $OUT/c2/ab.err; echo "gdn $1 rc=$? ${SECONDS}s"; }
gdn OLD; gdn NEW; gdn NEW; gdn OLD
tail -3 $OUT/c2/ab.err
cd $OUT && tar czf c2.tgz c2 && rm -rf c2
