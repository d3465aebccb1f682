# Session 34 call 3 (same tree): issue 24's bars at 1x32k 2/8 and seed 000's sweep (12/12) with FlashQLA in the same
# run, as far as the call's time goes (rows are printed as measured). Carry [".peers", ".ab3/s34"].
mkdir -p /tmp/site && tar -xJf .peers/peers.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/k3/gdn_2_8 $OUT/k3/gdn_sweep
SECONDS=0
timeout 60 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > /dev/null 2>&1; echo "build rc=$? ${SECONDS}s"
timeout 170 python3 bench/run_all.py --out $OUT/k3/gdn_2_8 --benchmarks "gdn backward" --gdn-peers flashqla --gdn-backward-shapes 2/8 > $OUT/k3/gdn_2_8/run_all.log 2>&1; echo "2/8 rc=$? ${SECONDS}s"
grep "gdn backward" $OUT/k3/gdn_2_8/SUMMARY.md | cut -d'|' -f3,4,7
timeout $((400 - SECONDS)) python3 bench/run_all.py --out $OUT/k3/gdn_sweep --benchmarks "gdn backward" --gdn-peers flashqla --gdn-backward-shapes "12/12 strong" > $OUT/k3/gdn_sweep/run_all.log 2>&1; echo "sweep rc=$? ${SECONDS}s"
grep -E "^\(|^\{'shape'" $OUT/k3/gdn_sweep/run_all.log | cut -c1-200
cd $OUT && tar czf k3.tgz k3 && rm -rf k3
