"""Cache-aware routing: send a chat where its prompt's prefix is cached.

The router keeps, per worker, an approximate record of the prompts it has sent there, as the
chained block hashes of ``router.prompt`` (the approach of SGLang's router and Dynamo's
KV router, over the JSON the router parses anyway rather than over tokens). One table maps a
block's hash to a bitmask of the workers holding it; a request walks its blocks from the first
and keeps the workers that hold each one, and the last non-empty set has the longest match.
Each worker's blocks are an LRU bounded by its prefix cache (the tokens it reports, estimated
from characters), so that the record forgets roughly what the engine's radix cache evicts; a
worker that restarts (a new ``started_at``) or leaves loses its record.

Python's ``hash`` is salted per process: the record is this process's own, like each router's
in the field (with ``--processes N`` each process learns from the requests it serves).
"""

from __future__ import annotations

from collections.abc import Sequence

from router.classify import Classified
from router.metrics import PrefixOutcome
from router.policies import choose_round_robin, over_bound
from router.prompt import Blocks
from router.view import FleetView, WorkerPrefixes, WorkerState

# bytes of router memory per (block, worker) entry: the hash table's share and the LRU's entry,
# measured with tracemalloc (tests/test_router_prefix.py checks the figure)
BYTES_PER_ENTRY = 200


def _requests_on(worker: WorkerState) -> float:
    load = worker.fresh_load()
    n = worker.in_flight if load is None else max(worker.in_flight, load.in_flight)
    return n / worker.capacity


class PrefixIndex:
    def __init__(
        self,
        view: FleetView,
        bound: float,
        slack: int,
        max_blocks: int,
        static_tokens: int,
    ) -> None:
        self.bound = bound
        self.slack = slack
        self.max_blocks = max_blocks
        self.static_tokens = static_tokens
        self.holders: dict[int, int] = {}  # block hash -> bitmask of the workers holding it
        self.records: set[WorkerPrefixes] = set()  # one per worker that has one
        self.by_bit: dict[int, WorkerState] = {}  # the worker of each record
        self.free_bits: list[int] = []
        self.next_bit = 1
        view.cache_lost = self.forget  # a restart or a departure drops the worker's record

    def _budget(self, worker: WorkerState) -> int:
        return self.static_tokens if worker.static else worker.record.prefix_cache_tokens

    def place(
        self, c: Classified, capable: Sequence[WorkerState], open_: Sequence[WorkerState]
    ) -> tuple[WorkerState, PrefixOutcome]:
        """The worker for a text chat with prompt blocks (``c.blocks``), and the outcome; the
        worker holds the blocks from now on. The common case, one worker holding the longest
        match, costs a walk and a few lookups."""
        blocks: Blocks = c.blocks  # type: ignore[assignment]
        holders = self.holders
        mask = 0  # the workers holding the longest run of the first blocks (the walk, inlined)
        for h, _tokens in blocks:
            m = holders.get(h, 0) & (mask or -1)
            if not m:
                break
            mask = m
        target: WorkerState | None = None
        if mask and mask & (mask - 1) == 0:  # one worker holds it: the common case
            target = self.by_bit[mask]
            if target not in open_:  # it cannot take the request now
                target = None
        if mask and target is None:
            # several hold it, or the one that does cannot take it: the longest match among
            # the workers that can, and of its holders the one with the fewest requests
            mask = self._longest(blocks, open_)
            least = 0.0
            for w in open_:
                held = w.prefix
                if held is not None and held.bit & mask:
                    n = w.in_flight / w.capacity
                    if target is None or n < least:
                        target, least = w, n
        if target is None:  # no worker that can take it holds its start
            worker = self._newcomer(open_, c.stage_class)
            self.record(worker, blocks)
            return worker, PrefixOutcome.MISS
        # (loads are this router's own in-flight counts, as in SGLang's router: a worker's report
        # may still count a conversation's previous turn, which would move it off its cache;
        # the slack keeps it there while loads differ by a few requests, which a batching
        # engine barely notices)
        if target.in_flight >= self.slack and over_bound(
            target, capable, c.stage_class, self.bound, reports=False, slack=self.slack
        ):
            worker = self._newcomer(open_, c.stage_class)
            self.record(worker, blocks)
            return worker, PrefixOutcome.OVERLOADED
        record: WorkerPrefixes = target.prefix  # type: ignore[assignment]
        record.hits += 1
        if blocks[-1][0] in record.blocks:  # it holds all of it: the head becomes the most
            record.placed += 1  # recent (a tail that ages out first still leaves a match)
            record.blocks.move_to_end(blocks[0][0])
        else:
            self.record(target, blocks)
        return target, PrefixOutcome.HIT

    def _longest(self, blocks: Blocks, workers: Sequence[WorkerState]) -> int:
        """Those of ``workers`` holding the longest run of the prompt's first blocks (bits; 0
        if none holds the first)."""
        allowed = 0
        for w in workers:
            if w.prefix is not None:
                allowed |= w.prefix.bit
        holders = self.holders
        found = 0
        for h, _tokens in blocks:
            m = holders.get(h, 0) & allowed
            if not m:
                break
            allowed = found = m
        return found

    @staticmethod
    def _newcomer(open_: Sequence[WorkerState], stage_class: str) -> WorkerState:
        """A prompt no worker holds: the worker with the fewest requests (this router's count
        or the worker's report, whichever says more), and among equals the one that least
        recently took such a prompt, so that new conversations spread evenly. (Not the busy
        fractions of ``load_score``: they differ by noise between idle workers, and would send
        every new conversation to the same one.)"""
        counts = [_requests_on(w) for w in open_]
        least = min(counts)
        ties = [w for w, n in zip(open_, counts, strict=True) if n == least]
        return ties[0] if len(ties) == 1 else choose_round_robin(ties, stage_class, None)

    def record(self, worker: WorkerState, blocks: Blocks) -> None:
        """The request with these blocks went to ``worker``: it now holds them (if it caches)."""
        record = worker.prefix
        if record is None:
            budget = self._budget(worker)
            if not budget or worker.gone:
                return
            if self.free_bits:
                bit = self.free_bits.pop()
            else:
                bit, self.next_bit = self.next_bit, self.next_bit << 1
            record = worker.prefix = WorkerPrefixes(worker, bit, budget)
            self.records.add(record)
            self.by_bit[bit] = worker
        record.placed += 1
        holders, lru, bit = self.holders, record.blocks, record.bit
        # the last block first: the first block ends up the most recent, so that eviction takes
        # a prompt's tail before its head (a head alone still matches; a tail alone never does)
        for h, tokens in reversed(blocks):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = tokens
                record.tokens += tokens
                holders[h] = holders.get(h, 0) | bit
        if record.tokens > record.budget:
            while record.tokens > record.budget and len(lru) > 1:
                self._evict(record)
        if len(holders) > self.max_blocks:
            self._trim()

    def _evict(self, record: WorkerPrefixes) -> None:
        h, tokens = record.blocks.popitem(last=False)
        record.tokens -= tokens
        left = self.holders[h] & ~record.bit
        if left:
            self.holders[h] = left
        else:
            del self.holders[h]

    def _trim(self) -> None:
        """Over the router's memory bound: the records with the most blocks give up their oldest."""
        while len(self.holders) > self.max_blocks:
            biggest = max(self.records, key=lambda r: len(r.blocks))
            for _ in range(max(1, len(biggest.blocks) // 16)):
                self._evict(biggest)

    def forget(self, worker: WorkerState) -> None:
        """The worker lost its cache (it restarted or left): nothing is cached there now."""
        record = worker.prefix
        if record is None:
            return
        worker.prefix = None
        while record.blocks:
            self._evict(record)
        self.records.discard(record)
        del self.by_bit[record.bit]
        self.free_bits.append(record.bit)

    def describe(self, worker: WorkerState) -> dict:
        record = worker.prefix
        if record is None:
            return {"blocks": 0, "tokens": 0, "cached_share": None}
        share = round(record.hits / record.placed, 3) if record.placed else None
        return {"blocks": len(record.blocks), "tokens": record.tokens, "cached_share": share}

    def gauges(self) -> dict[str, float]:
        entries = sum(len(r.blocks) for r in self.records)
        return {
            "prefix_blocks": len(self.holders),
            "prefix_memory_bytes": entries * BYTES_PER_ENTRY,
        }
