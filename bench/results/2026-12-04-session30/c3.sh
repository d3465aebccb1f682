# Session 30 call 3 (tree $1): issue 24's bars at seed 000's sweep points (12/12, both gate regimes) with FlashQLA in
# the same run (call 2 measured the table's shapes before its limit), the kernel path as autograd's.
mkdir -p /tmp/site && tar -xJf .peers/peers.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c3/gdn
SECONDS=0
KGEN_GDN_BACKWARD=kernel timeout 500 python3 bench/run_all.py --out $OUT/c3/gdn --benchmarks "gdn backward" --gdn-peers flashqla --gdn-backward-shapes 12/12 > $OUT/c3/gdn/run_all.log 2>&1; echo "gdn rc=$? ${SECONDS}s"
grep "gdn backward" $OUT/c3/gdn/SUMMARY.md | cut -d'|' -f3,4,7
grep -v TileLang $OUT/c3/gdn/run_all.log | grep flashqla_status | cut -c1-300
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
