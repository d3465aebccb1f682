# Session 24 call 1: step 2b's first run (tests, sanitizers), probes 2a vs 2b, GDN dg states.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; tar -xJf .peers/peers.tar.xz -C /tmp/site
export PYTHONPATH=$PWD:/tmp/site:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR=/tmp/tlcache
mkdir -p $OUT/c1
SW=tests/specs/single_warpgroup
KGEN_SPEC_PATH=$SW timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py -k wgmma-hd128-m64 -x > $OUT/c1/tests_2b.log 2>&1; echo "tests rc=$?"; tail -5 $OUT/c1/tests_2b.log
for t in memcheck racecheck; do
KGEN_SPEC_PATH=$SW timeout 120 compute-sanitizer --tool $t --report-api-errors no python3 tools/sanitizer_case.py attention_and_gated_delta_rule > $OUT/c1/san_$t.log 2>&1; echo "$t rc=$?"; tail -3 $OUT/c1/san_$t.log
done
L=16,32,64,65,128,129,256,257,385,448,513,576
KGEN_SPEC_PATH=$SW timeout 150 python3 tools/prefill_tile_probe.py --lengths $L --shapes wgmma:64:64,wgmma:128:128,mma_sync:64:64 --rounds 2 > $OUT/c1/probe_2b.txt 2>&1; echo "probe2b rc=$?"; cat $OUT/c1/probe_2b.txt | tail -20
timeout 150 python3 tools/prefill_tile_probe.py --lengths $L --shapes wgmma:64:64,wgmma:128:128,mma_sync:64:64 --rounds 2 > $OUT/c1/probe_2a.txt 2>&1; echo "probe2a rc=$?"; cat $OUT/c1/probe_2a.txt | tail -20
