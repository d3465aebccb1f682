# The next session's first device call (about 400-550 s). Ready it with
#   bash tools/device_trees.sh old=main combo=wip/roll-lean-evict ovl=wip/overlap-epilogue
# and run `bash bench/results/2026-12-05-session39/next_call1.sh 2>&1 | tail -80` with carry [".whl", ".ab3/trees"].
# old: main's kernels. combo: the lean SwiGLU epilogue, evict_first and paired loads for b tiles read once, FP8
# products in 64-column parts. ovl: combo with the 16-bit results stored while the next tile's first products run.
# The copy bandwidth both ways; ovl's and combo's grouped GEMM GPU tests; an A/B ABCCBA over processes at the
# balanced shapes (every op); then ovl's MoE racecheck and memcheck while time is left.
SECONDS=0; DIR=$OUT/c1; source tools/device_lib.sh
python3 bench/results/2026-12-05-session37/copy_rates.py 2>&1 | tee "$DIR/copy_rates.txt"
build old combo ovl
gpu_tests ovl
gpu_tests combo
for t in old combo ovl ovl combo old; do ab $t --calls bf16,swiglu_fp8_out,fp8 --routing balanced; done
python3 tools/ab_summary.py "$DIR" old combo ovl | tee "$DIR/summary.txt"; tail -3 "$DIR/ab.err"
SANITIZE_UNTIL=480 sanitize ovl racecheck memcheck
cd "$OUT" && tar czf c1.tgz c1 && rm -rf c1
