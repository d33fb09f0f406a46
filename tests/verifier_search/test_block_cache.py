"""The simulator's prefix cache (systems/verifier_search/sim.py BlockCache) against its definition, written the
plain way (a pin count on every block of every pinned chain): random admissions and releases of
chains (root-to-node paths of a random block tree, as ``block_hashes`` gives them, repeats included)
leave the same pinned blocks, the same LRU order of free blocks and the same answers."""

import random
from collections import OrderedDict

from systems.verifier_search.sim import BlockCache


class Reference:
    """The definition: pin every distinct block (missing ones inserted, free ones taken out of the
    LRU list), evict free blocks LRU-first to make room, refuse when pins leave none."""

    def __init__(self, capacity: int):
        self.capacity, self.ref, self.free, self.reserved = capacity, {}, OrderedDict(), 0

    def try_admit(self, hs, extra):
        uniq = list(dict.fromkeys(hs))
        to_pin = [h for h in uniq if h not in self.ref]
        if len(self.ref) + len(to_pin) + self.reserved + extra > self.capacity:
            return False
        for h in uniq:
            self.free.pop(h, None)
        over = len(self.ref) + len(self.free) + self.reserved + len(to_pin) + extra - self.capacity
        for _ in range(max(0, over)):
            if self.free:
                self.free.popitem(last=False)
        for h in hs:
            self.ref[h] = self.ref.get(h, 0) + 1
        self.reserved += extra
        return True


def test_admission_as_defined():
    """Mutations caught: free blocks being pinned left in the LRU list (pop skipped), the deepest
    pinned block not counting its new child (``if k:`` branch dropped), a release freeing its blocks
    leaf first, the pinned prefix's binary search one short (``hi = mid - 1``), hits past the pinned
    prefix looked up among pinned blocks instead of free ones."""
    rnd = random.Random(11)
    parent = {0: None}
    for node in range(1, 300):  # a random tree of blocks; chain = path to a node
        parent[node] = rnd.randrange(node) if rnd.random() < 0.9 else None

    def chain(node):
        out = []
        while node is not None:
            out.append(node)
            node = parent[node]
        return out[::-1]

    for trial in range(60):
        cap = rnd.randrange(20, 80)
        c, ref = BlockCache(cap, 16), Reference(cap)
        held = []
        for _ in range(200):
            if held and rnd.random() < 0.45:
                hs, extra = held.pop(rnd.randrange(len(held)))
                produced = [rnd.randrange(300) for _ in range(rnd.randrange(4))]
                c.release(hs, extra, produced)
                ref_release(ref, hs, extra, produced)
            else:
                hs = chain(rnd.randrange(300)) if held == [] or rnd.random() < 0.7 else list(rnd.choice(held)[0])
                extra = rnd.randrange(3)
                ok = c.try_admit(hs, extra)
                assert ok == ref.try_admit(hs, extra)
                if ok:
                    held.append((hs, extra))
            assert set(c.ref) == set(ref.ref) and list(c.free) == list(ref.free) and c.reserved == ref.reserved
            assert c.hit_tokens(hs, 16 * 8) == 16 * next(
                (i for i, h in enumerate(hs[:7]) if h not in ref.ref and h not in ref.free), len(hs[:7])
            )


def ref_release(ref: Reference, pinned, reserved, produced):
    """BlockCache.release's definition (unpin to the LRU list's end, cache produced blocks)."""
    ref.reserved -= reserved
    for h in pinned:
        if h in ref.ref:
            ref.ref[h] -= 1
            if ref.ref[h] == 0:
                del ref.ref[h]
                ref.free[h] = None
    for h in produced:
        if h in ref.ref:
            continue
        if h in ref.free:
            ref.free.move_to_end(h)
            continue
        if len(ref.ref) + len(ref.free) + ref.reserved >= ref.capacity:
            if not ref.free:
                break
            ref.free.popitem(last=False)
        ref.free[h] = None
