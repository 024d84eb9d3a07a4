"""Decision-by-decision check of blocksim's radix tree against SGLang's own `RadixCache`.

SGLang's radix cache is pure Python over torch tensors. This script drives SGLang's class and
`blocksim.memory.radix_tree.RadixTree` with the same operations, derived from a trace's requests
as the sglang preset issues them (match a prompt, lock the match, insert the prompt, later insert
prompt + outputs and unlock; evict whenever the cached tokens exceed a capacity), and compares
every result: matched lengths, evictable and protected sizes, tokens evicted.

SGLang is not a dependency of blocksim: run it with an interpreter that has SGLang installed
(`pip install --no-deps sglang==0.4.6.post1` in a virtual environment made with
`--system-site-packages`, for torch). Only `sglang.srt.mem_cache.radix_cache` is loaded; the two
modules it imports for types and a global (`schedule_batch`, `memory_pool`) are stubbed, and its
clock (`time.time`) is replaced by a counter so that equal times cannot make the order arbitrary.

    /path/to/venv/bin/python benchmarks/check_sglang_radix.py [TRACE] [--requests N] [--page-size P]
        [--capacity TOKENS] [--running R]

After every eviction the multisets of node sizes are compared too (which nodes went).

Token ids given to SGLang: position p of a request with prefix hashes covering it is
`hash * H + p % H` (H tokens per hash); any other position is unique to the request.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
import types
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MOONCAKE = ROOT.parent / "shared/traces/mooncake/synthetic_trace.jsonl"
PRIVATE = 1 << 40


def load_sglang_radix_cache():
    """SGLang's radix_cache module without the rest of SGLang (stubs for its two heavy imports)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        raise SystemExit("SGLang is not installed in this interpreter (see the module docstring)")
    pkg_dir = Path(spec.submodule_search_locations[0])
    for name, path in (("sglang", pkg_dir), ("sglang.srt", pkg_dir / "srt"),
                       ("sglang.srt.mem_cache", pkg_dir / "srt/mem_cache"), ("sglang.srt.managers", pkg_dir / "srt/managers")):
        m = types.ModuleType(name)
        m.__path__ = [str(path)]
        sys.modules[name] = m
    sb = types.ModuleType("sglang.srt.managers.schedule_batch")
    sb.global_server_args_dict = {}
    sys.modules[sb.__name__] = sb
    mp = types.ModuleType("sglang.srt.mem_cache.memory_pool")
    mp.ReqToTokenPool = mp.TokenToKVPoolAllocator = object
    sys.modules[mp.__name__] = mp
    from sglang.srt.mem_cache import radix_cache
    ticks = itertools.count(1)
    radix_cache.time = types.SimpleNamespace(time=lambda: float(next(ticks)), monotonic=lambda: float(next(ticks)))
    return radix_cache, pkg_dir


class FreedCounter:
    """SGLang's allocator as the radix cache sees it: `free(indices)` and a device."""

    def __init__(self, torch) -> None:
        self.device = torch.device("cpu")
        self.freed = 0

    def free(self, indices) -> None:
        self.freed += len(indices)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default=str(MOONCAKE))
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--capacity", type=int, default=60000, help="cached tokens kept before evicting")
    p.add_argument("--running", type=int, default=8, help="requests holding locks at once")
    p.add_argument("--outputs", type=int, default=24, help="private tokens appended at finish")
    p.add_argument("--clip", type=int, default=8192, help="prompt tokens kept per request")
    a = p.parse_args()

    import torch

    import traces
    from blocksim.memory.radix_tree import Content, RadixTree

    radix_cache, pkg_dir = load_sglang_radix_cache()
    tr = traces.head(traces.read_trace(a.trace), a.requests)
    H = tr.hash_block_tokens
    ps = a.page_size
    if not H or H % ps:
        raise SystemExit(f"the trace needs prefix hashes whose granularity the page size {ps} divides")
    alloc = FreedCounter(torch)
    theirs = radix_cache.RadixCache(None, alloc, ps)
    ours = RadixTree(ps, H)
    ours_freed = [0]
    kv = itertools.count()

    def tokens(uid, hashes, n, shared):
        return [hashes[i // H] * H + i % H if i < shared else PRIVATE + uid * (1 << 20) + i for i in range(n)]

    checks = 0
    running: deque = deque()

    def node_sizes_theirs():
        out, stack = [], [theirs.root_node]
        while stack:
            n = stack.pop()
            if n is not theirs.root_node:
                out.append(len(n.value))
            stack.extend(n.children.values())
        return sorted(out)

    def compare(what, shape=False):
        nonlocal checks
        got = (ours.evictable_tokens, ours.protected_tokens, ours_freed[0])
        want = (theirs.evictable_size(), theirs.protected_size(), alloc.freed)
        if got != want:
            raise SystemExit(f"{what}: (evictable, protected, evicted) blocksim {got} != SGLang {want}")
        if shape:  # after an eviction: the same nodes are left (their sizes, as a multiset)
            mine = sorted(n.end - n.start for n in ours.nodes() if n is not ours.root)
            if mine != node_sizes_theirs():
                raise SystemExit(f"{what}: the trees' node sizes differ after eviction")
        checks += 1

    def finish(req):
        uid, content, ids, node_o, node_t = req
        end = len(ids) - len(ids) % ps
        v = torch.tensor([next(kv) for _ in range(end)], dtype=torch.int64)
        pre_t = theirs.insert(ids[:end], v)
        pre_o, _ = ours.insert(content, end, list(range(end // ps)))
        if pre_t != pre_o:
            raise SystemExit(f"request {uid} finish: prefix in tree blocksim {pre_o} != SGLang {pre_t}")
        theirs.dec_lock_ref(node_t)
        ours.dec_lock(node_o)
        compare(f"request {uid} finish")

    df = tr.df
    for uid, (prompt, hashes) in enumerate(zip(df.prompt_tokens.tolist(), df.prefix_hashes.tolist())):
        prompt = min(prompt, a.clip)
        shared = min(prompt, len(hashes) * H)
        shared -= shared % ps
        content = Content(uid, [int(h) for h in hashes], shared)
        ids = tokens(uid, content.hashes, prompt, shared)
        # admission: match all but the last token, lock the match
        value, node_t = theirs.match_prefix(ids[: prompt - 1])
        end_o, node_o = ours.match(content, prompt - 1)
        if len(value) != end_o:
            raise SystemExit(f"request {uid} match: blocksim {end_o} tokens != SGLang {len(value)}")
        theirs.inc_lock_ref(node_t)
        ours.inc_lock(node_o)
        compare(f"request {uid} lock")
        # its prefill inserted (cache_unfinished_req), the new path locked instead of the match
        end = prompt - prompt % ps
        v = torch.tensor([next(kv) for _ in range(end)], dtype=torch.int64)
        pre_t = theirs.insert(ids[:end], v)
        pre_o, leaf_o = ours.insert(content, end, list(range(end // ps)))
        if pre_t != pre_o:
            raise SystemExit(f"request {uid} insert: prefix in tree blocksim {pre_o} != SGLang {pre_t}")
        _, leaf_t = theirs.match_prefix(ids[:end])
        _, leaf_o = ours.match(content, end)
        theirs.inc_lock_ref(leaf_t)
        theirs.dec_lock_ref(node_t)
        ours.inc_lock(leaf_o)
        ours.dec_lock(node_o)
        compare(f"request {uid} insert")
        out_ids = ids + [PRIVATE + uid * (1 << 20) + prompt + i for i in range(a.outputs)]
        running.append((uid, content, out_ids, leaf_o, leaf_t))
        if len(running) > a.running:
            finish(running.popleft())
        total = theirs.evictable_size() + theirs.protected_size()
        if total > a.capacity:
            theirs.evict(total - a.capacity)
            ours.evict(total - a.capacity, lambda pages: ours_freed.__setitem__(0, ours_freed[0] + len(pages) * ps))
            compare(f"request {uid} evict", shape=True)
    while running:
        finish(running.popleft())
    print(f"SGLang {pkg_dir.parent.name and pkg_dir} radix cache vs blocksim: {checks} checks over "
          f"{len(df)} requests (page size {ps}, capacity {a.capacity} tokens, {a.running} running): all equal; "
          f"{alloc.freed} tokens evicted by both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
