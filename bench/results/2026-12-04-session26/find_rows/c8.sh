# Session 26 call 8: a packed item's row search after its loads are issued (find_rows): packed GPU tests,
# sanitizers, and the planner's call A/B against the tree before (old/).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
OLD=/tmp/site:$PWD/.ab3/s26/old:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1
mkdir -p $OUT/c8
PYTHONPATH=$NEW timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_attention_gpu.py -k "packed or poisoned_neighbours_never" > $OUT/c8/gpu_packed.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/c8/gpu_packed.log
for tool in memcheck racecheck; do
PYTHONPATH=$NEW timeout 40 compute-sanitizer --tool $tool --report-api-errors no python3 .ab3/s26/san_packed.py > $OUT/c8/san_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $OUT/c8/san_$tool.log
done
for round in 1 2; do for tree in OLD NEW; do
PYTHONPATH=${!tree} timeout 40 python3 .ab3/s26/probe_packed.py --lengths 16,32,65,129,257 --arms plan --rounds 3 > $OUT/c8/probe_${tree}_$round.txt 2>&1; echo "$tree $round: $(grep -o '"L": [0-9]*, "plan": [0-9.]*, "cudnn": [0-9.]*' $OUT/c8/probe_${tree}_$round.txt | sed 's/"//g' | tr '\n' ';')"
done; done
cd $OUT && tar czf c8.tgz c8 && rm -rf c8
