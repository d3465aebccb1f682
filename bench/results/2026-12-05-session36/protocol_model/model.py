#!/usr/bin/env python3
"""Randomised-interleaving model of templates/grouped_gemm/wgmma.cuh's synchronisation (branch wip/gemm-all).

Actors are generators that yield a wait condition (a callable; None = always enabled). Everything between two
yields is atomic. Each scheduling step picks, at random (with per-run random speed weights), one enabled actor or
one pending asynchronous event (a TMA box landing, a wgmma group completing) and advances it.

Modelled per block (one block, or a cluster of two):
  * scheduler warp: kScheduleSlots=2 slots with full/empty mbarriers (count 1), then a 'done' tile;
  * producer lane 0: per tile kt loop, wait empty(step) parity ((step/S)&1)^1, paired wait on empty(step+1)
    for even kt with kt+1<K, stage_tiles write at kt==0, arrive_expect_tx on full, TMA boxes (A own; B boxes own,
    or in a cluster with shares_b box `rank` multicast into both blocks); done: arrive on full without bytes;
  * consumer WARPS (4 per warpgroup, each independent; lane 0 releases => one arrival per warp on own empty and,
    in a cluster, on the peer's; empty count = kConsumerWarps * kCluster);
  * wgmma as per-warpgroup commit groups completing at random times once all 4 warps issued them; wait<N>;
  * named barrier 1 counting threads (32 per warp), expected kConsumerThreads, arrive non-blocking, sync blocks;
  * mbarrier phases with tx-count (may go negative: the peer's multicast bytes can land before expect_tx);
    wait(parity) passes iff (completed_phases & 1) != parity;
  * cluster_sync at the end in clusters (everyone must get there).
Checks: wgmma issue/completion reads a stage whose every part holds that step; a TMA write (issue and landing)
into a stage of step n needs every consumer warp of the target block to have released step n-S; stage_tiles read
gives the step's tile; a warp's second bar.arrive before its first completed; deadlock.
"""
import random, sys, argparse, itertools

class Violation(Exception):
    pass

class MBar:
    def __init__(self, count):
        self.count = count; self.pending = count; self.tx = 0; self.phase = 0
    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1; self.pending = self.count
    def arrive(self):
        self.pending -= 1
        if self.pending < 0: raise Violation("mbarrier over-arrived")
        self._check()
    def arrive_expect_tx(self, b):
        self.tx += b; self.arrive()
    def complete_tx(self, b):
        self.tx -= b; self._check()
    def test(self, parity):
        return (self.phase & 1) != parity

class NamedBar:
    def __init__(self, expected):
        self.expected = expected; self.count = 0; self.gen = 0; self.arrived = {}
    def _add(self):
        self.count += 32
        if self.count >= self.expected:
            self.gen += 1; self.count = 0
    def arrive(self, who):
        if self.arrived.get(who) == self.gen:
            raise Violation(f"{who}: second bar.arrive at the skew barrier while its first is pending")
        self.arrived[who] = self.gen; self._add()
    def sync(self, who):
        g = self.gen; self._add(); return g


class Model:
    def __init__(self, S, K, G, fp8, C, tiles, rng, v):
        # v: variant switches (defaults = the code as written)
        self.S, self.K, self.G, self.fp8, self.C, self.rng, self.v = S, K, G, fp8, C, rng, v
        self.tiles = tiles  # list of units: dict(rows=[rows_valid per rank], shares_b, col_blocks)
        self.W = 4 * G
        empty_count = self.W if v.get("no_remote") else self.W * C
        self.full = [[MBar(1) for _ in range(S)] for _ in range(C)]
        self.empty = [[MBar(empty_count) for _ in range(S)] for _ in range(C)]
        self.sfull = [[MBar(1) for _ in range(2)] for _ in range(C)]
        self.sempty = [[MBar(1) for _ in range(2)] for _ in range(C)]
        self.slots = [[None, None] for _ in range(C)]
        self.stage_tiles = [[None] * S for _ in range(C)]
        nparts = 3  # A, B box 0, B box 1
        self.content = [[[None] * nparts for _ in range(S)] for _ in range(C)]
        self.released = [[[-1] * self.W for _ in range(S)] for _ in range(C)]  # released[b][stage][warp] = step
        self.last_release = [[-1] * self.W for _ in range(C)]
        self.named = [NamedBar(v.get("named_expected", 32 * self.W)) for _ in range(C)]
        # wgmma groups per (block, warpgroup): list of dict(issued=set, done=bool, reads=(stage, step) or None)
        self.wg = [[[] for _ in range(G)] for _ in range(C)]
        self.wg_count = [[0] * self.W for _ in range(C)]
        self.events = []  # pending async events: callables
        self.at_leave = 0
        self.nactors = 0
        self.computed = [[[] for _ in range(self.W)] for _ in range(C)]
        skew_ok = G == 2 and not (fp8 and C > 1) and (K >= S or v.get("no_k_gate"))
        self.skew = v.get("skew", 2) if skew_ok and not v.get("noskew") else None
        self.pair = v.get("pair", True)

    # ---------------- helpers
    def check_write(self, b, stage, step, what):
        need = step - self.S
        if need < 0: return
        for w in range(self.W):
            if self.released[b][stage][w] < need:
                raise Violation(f"{what}: write of step {step} into block {b} stage {stage} before warp {w} released step {need}")
    def _released(self, b, stage, w, step):
        return self.released[b][stage][w] >= step

    def release(self, b, w, step):
        stage = step % self.S
        if self.released[b][stage][w] >= step:
            raise Violation(f"warp {w} of block {b} released step {step} twice")
        self.released[b][stage][w] = step
        self.last_release[b][w] = max(self.last_release[b][w], step)
        self.empty[b][stage].arrive()
        if self.C > 1 and not self.v.get("no_remote"):
            self.empty[b ^ 1][stage].arrive()

    def check_read(self, b, stage, step, who):
        c = self.content[b][stage]
        if any(x != step for x in c):
            raise Violation(f"{who}: reads block {b} stage {stage} for step {step} but it holds {c}")

    # ---------------- actors
    def scheduler(self, b):
        found = 0
        units = self.tiles + [None]
        for u in units:
            slot = found % 2
            bar = self.sempty[b][slot]; par = ((found // 2) & 1) ^ 1
            yield lambda: bar.test(par)
            self.slots[b][slot] = u
            self.sfull[b][slot].arrive()
            found += 1
            yield None
        yield from self.leave()

    def producer(self, b):
        S, K = self.S, self.K
        step = 0
        taken = 0
        while True:
            slot = taken % 2
            bar = self.sfull[b][slot]; par = (taken // 2) & 1
            yield lambda: bar.test(par)
            u = self.slots[b][slot]
            self.sempty[b][slot].arrive()
            taken += 1
            done = u is None
            for kt in range(1 if done else K):
                n = step + kt; stage = n % S
                e = self.empty[b][stage]; par = ((n // S) & 1) ^ 1
                yield lambda e=e, par=par: e.test(par)
                if self.pair and not done and kt % 2 == 0 and kt + 1 < K:
                    e2 = self.empty[b][(n + 1) % S]; par2 = (((n + 1) // S) & 1) ^ 1
                    yield lambda: e2.test(par2)
                if kt == 0:
                    # stage_tiles write: every warp must be done with the step this stage held
                    self.check_write(b, stage, n, "stage_tiles")
                    self.stage_tiles[b][stage] = (n, u)
                if done:
                    self.full[b][stage].arrive()
                    break
                self.full[b][stage].arrive_expect_tx(4)  # A = 2 units, two B boxes 1 unit each
                self.issue(b, b, stage, n, 0, 2)
                for box in range(2):
                    if self.C > 1 and u["shares_b"]:
                        if box == b:
                            for tgt in range(self.C):
                                self.issue(b, tgt, stage, n, 1 + box, 1)
                        continue
                    self.issue(b, b, stage, n, 1 + box, 1)
                yield None
            if done:
                break
            step += K
        yield from self.leave()

    def issue(self, src, tgt, stage, n, part, units):
        self.check_write(tgt, stage, n, f"TMA issue by block {src}")
        def land():
            self.check_write(tgt, stage, n, f"TMA landing from block {src}")
            self.content[tgt][stage][part] = n
            self.full[tgt][stage].complete_tx(units)
        self.events.append(land)

    def leave(self):
        if self.C > 1:
            self.at_leave += 1
            yield lambda: self.at_leave == self.nactors
        return

    def wg_issue(self, b, g, w, stage, step):
        """warp w (of warpgroup g) issues (and commits) its part of a wgmma group reading stage."""
        lw = w % 4
        idx = self.wg_count[b][w]; self.wg_count[b][w] += 1
        groups = self.wg[b][g]
        if idx == len(groups):
            groups.append({"issued": set(), "done": False, "read": (stage, step)})
        grp = groups[idx]
        if grp["read"] != (stage, step):
            raise Violation("warps of a warpgroup issue different wgmma groups")
        self.check_read(b, stage, step, f"wgmma issue b{b} w{w}")
        grp["issued"].add(lw)
        if len(grp["issued"]) == 4:
            def complete():
                self.check_read(b, stage, step, f"wgmma completion b{b} g{g}")
                grp["done"] = True
            self.events.append(complete)

    def wg_wait(self, b, g, w, pending):
        n = self.wg_count[b][w]
        groups = self.wg[b][g]
        return lambda: all(groups[i]["done"] for i in range(max(0, n - pending)))

    def consumer(self, b, w):
        S, K, fp8 = self.S, self.K, self.fp8
        g = w // 4
        skew_step = None
        if self.skew is not None:
            skew_step = self.skew if g == 0 else 0
        nb = self.named[b]
        who = (b, w)
        def hand_over(kt):
            if kt == skew_step:
                if g == 0:
                    nb.arrive(who)
                else:
                    gen = nb.sync(who)
                    return lambda: nb.gen > gen
            return None
        step = 0
        while True:
            fs = step % S
            f = self.full[b][fs]; par = (step // S) & 1
            yield lambda f=f, par=par: f.test(par)
            st = self.stage_tiles[b][fs]
            if st is None or st[0] != step:
                raise Violation(f"consumer b{b} w{w}: stage_tiles of stage {fs} holds {st}, expected step {step}")
            u = st[1]
            if u is None:
                break
            rows = u["rows"][b]
            skip = (not fp8) and rows <= 64 * g
            if skip:
                for kt in range(K):
                    c = hand_over(kt)
                    if c: yield c
                    f = self.full[b][step % S]; par = (step // S) & 1
                    yield lambda f=f, par=par: f.test(par)
                    self.release(b, w, step)
                    step += 1
                    yield None
                continue
            self.computed[b][w].append(step)
            for kt in range(K):
                c = hand_over(kt)
                if c: yield c
                stage = step % S
                f = self.full[b][stage]; par = (step // S) & 1
                yield lambda f=f, par=par: f.test(par)
                if fp8:
                    cb = u["col_blocks"]
                    for col in range(cb):
                        self.wg_issue(b, g, w, stage, step)
                        yield self.wg_wait(b, g, w, 0)
                        if col == cb - 1:
                            self.release(b, w, step)
                        yield None
                    step += 1
                    continue
                self.wg_issue(b, g, w, stage, step)
                yield None
                if self.v.get("early_release"):
                    self.release(b, w, step)  # broken: before its products are done
                    step += 1
                    continue
                yield self.wg_wait(b, g, w, 1)
                if kt > 0:
                    self.release(b, w, step - 1)
                step += 1
                yield None
            if not fp8 and not self.v.get("early_release"):
                yield self.wg_wait(b, g, w, 0)
                self.release(b, w, step - 1)
            yield None  # epilogue
        yield from self.leave()

    # ---------------- run
    def run(self, max_steps=10**6):
        rng = self.rng
        actors = []
        for b in range(self.C):
            actors.append(("sched", b, self.scheduler(b)))
            actors.append(("prod", b, self.producer(b)))
            for w in range(self.W):
                actors.append((f"cons{w}", b, self.consumer(b, w)))
        self.nactors = len(actors)
        # per-run speed weights (log-uniform) to stretch interleavings; event weight too
        weight = {i: 10 ** rng.uniform(-2, 1) for i in range(len(actors))}
        ev_weight = 10 ** rng.uniform(-2, 1)
        conds = {}
        live = set(range(len(actors)))
        for i in list(live):
            conds[i] = None
        trace = []
        for _ in range(max_steps):
            enabled = [i for i in live if conds[i] is None or conds[i]()]
            cands = [(weight[i], ("a", i)) for i in enabled]
            if self.events:
                cands.append((ev_weight * len(self.events), ("e", None)))
            if not cands:
                if not live:
                    return None
                blocked = [f"{actors[i][0]}@b{actors[i][1]}" for i in sorted(live)]
                raise Violation("DEADLOCK; blocked: " + ", ".join(blocked) + "; last: " + " | ".join(trace[-12:]))
            tot = sum(c[0] for c in cands); r = rng.uniform(0, tot)
            for wgt, c in cands:
                r -= wgt
                if r <= 0: break
            if c[0] == "e":
                ev = self.events.pop(rng.randrange(len(self.events)))
                ev()
                trace.append("event")
            else:
                i = c[1]
                try:
                    conds[i] = next(actors[i][2])
                    trace.append(f"{actors[i][0]}@b{actors[i][1]}")
                except StopIteration:
                    live.discard(i)
                    trace.append(f"{actors[i][0]}@b{actors[i][1]} exits")
            if len(trace) > 50: trace = trace[-50:]
            if not live and not self.events:
                return None
        raise Violation("step limit")


def random_tiles(rng, C):
    n = rng.randint(1, 8)
    units = []
    for _ in range(n):
        if C == 1:
            rows = [rng.choice([rng.randint(1, 64), rng.randint(65, 128), 128])]
        else:
            rows = [rng.choice([0, rng.randint(1, 64), rng.randint(65, 128), 128]) for _ in range(2)]
            if rows == [0, 0]: rows[rng.randrange(2)] = 128
        units.append({"rows": rows, "shares_b": rng.random() < 0.6, "col_blocks": rng.choice([1, 2])})
    return units


def run_one(S, K, G, fp8, C, seed, v):
    rng = random.Random(seed)
    tiles = random_tiles(rng, C)
    if G == 1:
        for u in tiles:
            u["rows"] = [min(r, 64) if r else 0 for r in u["rows"]]
    m = Model(S, K, G, fp8, C, tiles, rng, v)
    try:
        m.run()
    except Violation as e:
        return str(e), tiles
    # every non-skipped warp computed every step of its tiles
    return None, tiles


def sweep(v, stages, ks, groups, fp8s, clusters, seeds, stop_first=True, quiet=False):
    found = {}
    total = 0
    for S, K, G, fp8, C in itertools.product(stages, ks, groups, fp8s, clusters):
        for seed in range(seeds):
            total += 1
            err, tiles = run_one(S, K, G, fp8, C, seed, v)
            if err:
                key = (S, K, G, fp8, C)
                if key not in found:
                    found[key] = (seed, err, tiles)
                if stop_first: break
    return total, found


def _job(args):
    vv, S, K, G, fp8, C, seeds = args
    return sweep(vv, [S], [K], [G], [fp8], [C], seeds)


def psweep(vv, S, seeds):
    import multiprocessing as mp
    jobs = [(vv, S, K, G, fp8, C, seeds) for K in range(1, 11) for G in (1, 2) for fp8 in (False, True) for C in (1, 2)]
    with mp.Pool() as p:
        res = p.map(_job, jobs)
    total = sum(r[0] for r in res); found = {}
    for r in res: found.update(r[1])
    return total, found


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--variant", default="code")
    a = ap.parse_args()
    variants = {
        "code": ({}, range(3, 7)),
        "two_stages": ({"noskew": True}, [2]),                      # paired loads at 2 stages (static_assert forbids); skew off
        "two_stages_nopair": ({"pair": False, "noskew": True}, [2]),  # control: should pass
        "skew_eq_S": ("skewS", range(3, 7)),
        "skew_S_plus_1": ("skewS1", range(3, 7)),
        "no_k_gate": ({"no_k_gate": True}, range(3, 7)),
        "no_remote": ({"no_remote": True}, range(3, 7)),
        "early_release": ({"early_release": True}, range(3, 7)),
    }
    v, stages = variants[a.variant]
    results = {}
    for S in stages:
        if v == "skewS": vv = {"skew": S}
        elif v == "skewS1": vv = {"skew": S + 1}
        else: vv = dict(v)
        total, found = psweep(vv, S, a.seeds)
        results[S] = (total, found)
        print(f"variant={a.variant} S={S}: runs={total} failing configs={len(found)}")
        kinds = {}
        for key, (seed, err, tiles) in sorted(found.items()):
            kind = err.split(";")[0].split(": ")[-1][:70] if not err.startswith("DEADLOCK") else "DEADLOCK"
            kind = kind.split(" into block")[0].split(" before")[0] if "write" in kind else kind
            kinds.setdefault(kind, []).append(key)
        for kind, keys in kinds.items():
            print(f"   {kind}: {len(keys)} configs, e.g. (S,K,G,fp8,C)={keys[:4]}")
        for key, (seed, err, tiles) in list(sorted(found.items()))[:1]:
            print(f"   example {key} seed {seed}: {err[:600]}\n   tiles={tiles}")
    sys.stdout.flush()
