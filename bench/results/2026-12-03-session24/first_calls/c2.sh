python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; tar -xJf .peers/peers.tar.xz -C /tmp/site
export PYTHONPATH=$PWD:/tmp/site:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR=/tmp/tlcache
mkdir -p $OUT/c2
timeout 200 python3 tools/gdn_backward_errors.py --peers fla --states > $OUT/c2/dg_states.txt 2>&1; echo "states rc=$?"; tail -40 $OUT/c2/dg_states.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py -k setting > $OUT/c2/setting.log 2>&1; echo "setting rc=$?"; tail -5 $OUT/c2/setting.log
