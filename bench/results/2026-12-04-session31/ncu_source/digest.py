import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = sum(int(r[ix["Warp Stall Sampling (All Samples)"]] or 0) for r in data)
print("total samples", tot, "instructions", len(data), "executed", sum(int(r[ix["Instructions Executed"]] or 0) for r in data))
agg = {c: sum(int(r[ix[c]] or 0) for r in data) for c in stall_cols}
print(sorted(((v, c) for c, v in agg.items() if v), reverse=True)[:10])
mode = sys.argv[2] if len(sys.argv) > 2 else "top"
if mode == "top":
    top = sorted(range(len(data)), key=lambda i: -int(data[i][ix["Warp Stall Sampling (All Samples)"]] or 0))[:int(sys.argv[3]) if len(sys.argv) > 3 else 40]
    for i in sorted(top):
        r = data[i]
        s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        reasons = sorted(((int(r[ix[c]] or 0), c[6:]) for c in stall_cols if int(r[ix[c]] or 0)), reverse=True)[:3]
        print(f"{i:5d} {100*s/tot:5.2f}% ex={r[ix['Instructions Executed']]:>9} {r[1].strip()[:70]:70s} {reasons}")
else:
    a, b = map(int, mode.split(":"))
    for i in range(a, b):
        r = data[i]; s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        reasons = sorted(((int(r[ix[c]] or 0), c[6:]) for c in stall_cols if int(r[ix[c]] or 0)), reverse=True)[:2]
        print(f"{i:5d} {100*s/tot:5.2f}% ex={r[ix['Instructions Executed']]:>9} {r[1].strip()[:80]:80s} {reasons}")
