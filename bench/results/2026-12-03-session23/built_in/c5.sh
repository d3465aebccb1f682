# Session 23 call 5: the 64x64 two-block tile in the built-in spec: attention GPU tests (bf16 and fp16, the planner's
# choices), its neighbours, and the probe of the planner's choice against cuDNN over the short half of the sweep.
mkdir -p $OUT/c5
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py > $OUT/c5/gpu_tests_attention.log 2>&1; tail -2 $OUT/c5/gpu_tests_attention.log
tr '\n' '\0' < .ab3/nb_ids.txt | timeout 100 xargs -0 python3 -m pytest -q -m gpu -p no:cacheprovider > $OUT/c5/gpu_tests_neighbours.log 2>&1; tail -2 $OUT/c5/gpu_tests_neighbours.log
timeout 200 python3 tools/prefill_tile_probe.py --lengths 1,16,32,63,64,65,127,128,129,255,256,257,511,512 --shapes wgmma:128:128,mma_sync:64:64 --rounds 2 2>&1 | grep -v Warn | tee $OUT/c5/tile_probe.txt
