# Session 36, last call if one starts: only the racecheck question of d5.sh. The MoE racecheck on old (main's
# kernels) and slotfix (wip/slot-lane0: lane 0 alone reads a schedule slot). About 90 s.
SECONDS=0; DIR=$OUT/d6; source .ab3/s36/lib.sh
build old slotfix
for t in old slotfix; do
  sanitize $t racecheck; mv $DIR/san_moe_racecheck.log $DIR/san_moe_racecheck_$t.log
  grep -A1 "Race reported" $DIR/san_moe_racecheck_$t.log | head -4
done
cd $OUT && tar czf d6.tgz d6 && rm -rf d6
