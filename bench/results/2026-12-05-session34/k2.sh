# Session 34 call 2 (tree $1 = wip/gdn-kept with the stores and the test's GVA allowance): dq/dk of short GVA cases
# for kgen (both per-chunk paths) and fla against float64; the backward and torch.library GPU tests; then issue 24's
# bars at the table's shapes with FlashQLA in the same run, both gate regimes. Carry [".peers", ".ab3/s34"].
mkdir -p /tmp/site && tar -xJf .peers/peers.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/k2/gdn $OUT/tl_cache
SECONDS=0
timeout 60 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/k2/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
timeout 90 python3 .ab3/s34/probe_dq.py > $OUT/k2/probe_dq.jsonl 2> $OUT/k2/probe.err; echo "probe rc=$? ${SECONDS}s"; cat $OUT/k2/probe_dq.jsonl; tail -3 $OUT/k2/probe.err
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py tests/test_torch_library_gpu.py > $OUT/k2/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/k2/gpu_tests.log; grep -E "^FAILED|^E  +AssertionError" $OUT/k2/gpu_tests.log | head
TILELANG_CACHE_DIR=$OUT/tl_cache timeout $((585 - SECONDS)) python3 bench/run_all.py --out $OUT/k2/gdn --benchmarks "gdn backward" --gdn-peers flashqla --gdn-backward-shapes 16/32 > $OUT/k2/gdn/run_all.log 2>&1; echo "gdn rc=$? ${SECONDS}s"
grep "gdn backward" $OUT/k2/gdn/SUMMARY.md | cut -d'|' -f3,4,7
grep -E "^\{'shape'|^\(" $OUT/k2/gdn/run_all.log | cut -c1-330
cd $OUT && tar czf k2.tgz k2 tl_cache && rm -rf k2 tl_cache
