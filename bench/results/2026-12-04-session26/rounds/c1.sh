# Session 26 call 1: the second-round question. Per-round times of kgen (planned) and cuDNN at L=256,512,1024:
# interleaved, kgen alone, with cuCtxResetPersistingL2Cache; then the K/V loads at evict_normal (copy in nohint/).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=/tmp/site:$PWD:$PWD/tests:$PWD/bench
NOHINT=/tmp/site:$PWD/.ab3/s26/nohint:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE > $OUT/c1/nvsmi_start.txt 2>&1
for mode in interleaved alone reset; do
PYTHONPATH=$NEW timeout 100 python3 .ab3/s26/rounds.py --mode $mode > $OUT/c1/rounds_$mode.txt 2>&1; echo "$mode rc=$?"
cut -c1-200 $OUT/c1/rounds_$mode.txt
done
PYTHONPATH=$NOHINT timeout 120 python3 .ab3/s26/rounds.py --mode interleaved > $OUT/c1/rounds_nohint.txt 2>&1; echo "nohint rc=$?"
cut -c1-200 $OUT/c1/rounds_nohint.txt
PYTHONPATH=$NEW timeout 100 python3 .ab3/s26/rounds.py --mode interleaved > $OUT/c1/rounds_interleaved2.txt 2>&1; echo "interleaved2 rc=$?"
cut -c1-200 $OUT/c1/rounds_interleaved2.txt
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE > $OUT/c1/nvsmi_end.txt 2>&1
(cd $OUT && tar czf c1.tgz c1 && rm -rf c1)
