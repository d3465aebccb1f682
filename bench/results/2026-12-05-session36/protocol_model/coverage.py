# Coverage counters for the code variant: how often interesting situations occurred.
import model, random, collections
cov = collections.Counter()
orig_ct = model.MBar.complete_tx
def ct(self, b):
    if self.tx - b < 0: cov["tx negative (peer multicast before expect_tx)"] += 1
    orig_ct(self, b)
model.MBar.complete_tx = ct
orig_arr = model.NamedBar.arrive
def arr(self, who):
    if self.count > 0 and self.arrived.get(who) != self.gen: cov["arrive after some sync/arrive already in"] += 1
    orig_arr(self, who)
model.NamedBar.arrive = arr
orig_sync = model.NamedBar.sync
def sy(self, who):
    if self.count == 0: cov["group1 sync first (waits for group 0)"] += 1
    return orig_sync(self, who)
model.NamedBar.sync = sy
orig_prod = model.Model.producer
def prod(self, b):
    g = orig_prod(self, b); c = None
    while True:
        try: c = g.send(None) if c is None or True else None
        except StopIteration: return
        if c is not None and not c(): cov["producer blocked"] += 1
        yield c
model.Model.producer = prod
runs = 0
for S in range(3, 7):
    for K in range(S, 11):
        for C in (1, 2):
            for seed in range(15):
                rng = random.Random(seed); tiles = model.random_tiles(rng, C)
                if any(u["rows"][0] <= 64 for u in tiles): cov["tile with group 1 skipped"] += 1
                if C == 2 and any(0 in u["rows"] for u in tiles): cov["cluster block past end (both skip)"] += 1
                m = model.Model(S, K, 2, False, C, tiles, rng, {})
                m.run(); runs += 1
print(runs, dict(cov))
