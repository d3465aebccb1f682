# Session 23 call 4: the epilogue fix (tests, A/B against 1a55266), step 2a (tests, sanitizers, tile probe with cuDNN).
mkdir -p $OUT/c4
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py > $OUT/c4/gpu_tests_attention.log 2>&1; tail -2 $OUT/c4/gpu_tests_attention.log
KGEN_SPEC_PATH=.ab3/spec2a timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py -k "wgmma-hd128-m64" > $OUT/c4/gpu_tests_2a.log 2>&1; tail -2 $OUT/c4/gpu_tests_2a.log
for tool in memcheck racecheck; do KGEN_SPEC_PATH=.ab3/spec2a timeout 60 compute-sanitizer --tool $tool --report-api-errors no --kernel-regex kns=attention_prefill python3 .ab3/san_2a.py > $OUT/c4/san_2a_$tool.log 2>&1; tail -2 $OUT/c4/san_2a_$tool.log; done
base=$PYTHONPATH
for t in pre_epi . pre_epi .; do PYTHONPATH=$PWD/.ab3/$t:$base timeout 60 python3 tools/ab_kernels.py --label $t --only "L=32 causal,L=64 causal,L=128 causal,L=129 causal,2x8192 causal" 2>&1 | grep -v Warn; done | tee $OUT/c4/prefill_ab.txt
KGEN_SPEC_PATH=.ab3/spec2a timeout 200 python3 tools/prefill_tile_probe.py --lengths 63,64,65,127,128,129,256,257 --shapes wgmma:128:128,wgmma:64:64,wgmma:64:128,mma_sync:64:64 --rounds 2 2>&1 | grep -v Warn | tee $OUT/c4/tile_probe.txt
