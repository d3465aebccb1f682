# The next session's first device call (about 300-550 s; run with timeout_s 600). Ready it with
#   bash tools/device_trees.sh old=main combo=wip/roll-lean-evict ovl=wip/overlap-epilogue
# and run `bash bench/results/2026-12-05-session39/next_call1.sh 2>&1 | tail -80` with carry [".whl", ".ab3/trees"].
# old: main's kernels. combo: the lean SwiGLU epilogue, evict_first and paired loads for b tiles read once, FP8
# products in 64-column parts. ovl: combo with the 16-bit results stored while the next tile's first products run.
# The copy bandwidth both ways; ovl's grouped GEMM GPU tests (combo's too if ovl's fail); an A/B ABBA over processes
# of old and the tree that passed, at the balanced shapes (every op), with combo in the middle (ABCCBA) while time
# allows; then that tree's MoE racecheck and memcheck while time is left. Everything comes back in $OUT/c1.tgz.
SECONDS=0; DIR=/tmp/c1; source tools/device_lib.sh
python3 bench/results/2026-12-05-session37/copy_rates.py 2>&1 | tee "$DIR/copy_rates.txt"
build old combo ovl; pack
TREE=ovl; gpu_tests ovl || { gpu_tests combo && TREE=combo; }; pack
order="old $TREE $TREE old"; [ "$TREE" = ovl ] && [ $SECONDS -lt 200 ] && order="old combo ovl ovl combo old"
for t in $order; do [ $SECONDS -lt 470 ] && ab $t --calls bf16,swiglu_fp8_out,fp8 --routing balanced; pack; done
python3 tools/ab_summary.py "$DIR" old $(echo $order | tr ' ' '\n' | sort -u | grep -v '^old$') | tee "$DIR/summary.txt"; tail -3 "$DIR/ab.err"
SANITIZE_UNTIL=470 sanitize $TREE racecheck memcheck; pack
