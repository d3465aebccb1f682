# Session 23 call 1: the GPU tests of the three unrun changes.
mkdir -p $OUT/c1
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py tests/test_gdn_chunk_gpu.py > $OUT/c1/gpu_tests_gdn.log 2>&1; tail -15 $OUT/c1/gpu_tests_gdn.log
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py > $OUT/c1/gpu_tests_attention.log 2>&1; tail -15 $OUT/c1/gpu_tests_attention.log
