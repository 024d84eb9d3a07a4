"""SGLang's radix tree over token positions, with content known through prefix hashes.

SGLang's `RadixCache` (`python/sglang/srt/mem_cache/radix_cache.py`, SGLang 0.4-0.5) keys a tree
by token ids: each node holds a run of tokens and the KV-pool indices of their K/V ("value"), a
lock reference count (requests using the node's tokens) and a last-access time. Here token ids
are not kept (counts, not tokens); a token's identity is its *content key*:

* a prompt position inside the hashed part of a prompt (`Content.shared_len`: the prompt tokens
  covered by the trace's prefix hashes, cut to whole pages) is `(hash id, offset in hash block)`,
  so requests whose hash ids agree share those tokens, position by position;
* any other position (generated tokens, prompts of traces without hashes) is private to its
  request: `(uid, position, None)`.

Two requests therefore match up to the first hash block where their hash ids differ (or the end
of either's hashed part), cut down to whole pages. Each node keeps the `Content` of the request
that created it and its position range `[start, end)`; comparing a node with a query compares
hash ids block by block, never token by token.

With `page_size` N (dividing the hash granularity), nodes hold whole pages and `pages` lists one
pool page per N tokens; with N = 1 a page is a token slot, SGLang's default token-granular tree.

Invariants kept by every call: a node's `lock_ref` is the number of locked paths through it (the
root is always locked); `evictable_tokens` sums the tokens of unlocked nodes, `protected_tokens`
those of locked ones; every unlocked leaf has a live entry in the eviction heap. Eviction takes
the least recently used unlocked leaf first (ties: the older node), as SGLang's LRU strategy, and
a parent left childless and unlocked becomes a candidate at once.
"""

from __future__ import annotations

import heapq
from typing import Callable


class Content:
    """What a request's tokens are: its prefix hash ids and how many leading tokens they cover."""

    __slots__ = ("uid", "hashes", "shared_len")

    def __init__(self, uid: int, hashes, shared_len: int) -> None:
        self.uid = uid
        self.hashes = hashes
        self.shared_len = shared_len


class Node:
    __slots__ = ("children", "parent", "content", "start", "end", "pages", "lock_ref", "tick", "id")

    def __init__(self, parent, content, start: int, end: int, pages, node_id: int) -> None:
        self.children: dict = {}
        self.parent = parent
        self.content = content
        self.start = start
        self.end = end
        self.pages = pages
        self.lock_ref = 0
        self.tick = 0
        self.id = node_id

    def __repr__(self) -> str:
        return f"Node({self.id}, [{self.start}, {self.end}), lock={self.lock_ref})"


class RadixTree:
    """Match, insert, lock and evict over token positions (`page_size` tokens per page).

    `hash_tokens`: tokens per prefix hash (None: nothing is shared between requests). A tree made
    with `pages=False` stores no pool pages (SGLang's simulated tree for in-batch prefix checks).
    """

    def __init__(self, page_size: int, hash_tokens: int | None, pages: bool = True) -> None:
        self.page_size = page_size
        self.hash_tokens = hash_tokens
        self.store_pages = pages
        self._ids = 0
        self.root = Node(None, None, 0, 0, [] if pages else None, self._next_id())
        self.root.lock_ref = 1
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.tick = 0
        self._heap: list[tuple[int, int, Node]] = []
        self.evicted_tokens = 0
        self.evicted_nodes = 0
        self.num_nodes = 1

    def __del__(self) -> None:
        """Unlink the nodes (a node's `parent` and its parent's `children` form cycles) so that
        reference counting frees them, and the page lists they hold, with the tree: the cyclic
        garbage collector would hold them until it next runs."""
        stack = [self.root] if hasattr(self, "root") else []  # none when __init__ failed
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.children = {}
            node.parent = None

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _push(self, node: Node) -> None:
        """A heap entry for an unlocked leaf at its current time; stale entries (the node was
        touched, locked or evicted since) are skipped when popped and dropped when they pile up."""
        heap = self._heap
        heapq.heappush(heap, (node.tick, node.id, node))
        if len(heap) > 4 * self.num_nodes + 1024:
            self._heap = [e for e in heap if self._live_leaf(e[0], e[2])]
            heapq.heapify(self._heap)

    # --- content keys ------------------------------------------------------------------------
    def key(self, c: Content, pos: int):
        """The child key of the page starting at `pos` (SGLang: the page's first token ids)."""
        if pos + self.page_size <= c.shared_len:
            h = self.hash_tokens
            return (c.hashes[pos // h], pos % h)
        return (c.uid, pos, None)

    def _match_end(self, a: Content, b: Content, start: int, stop: int) -> int:
        """The end of the longest run of whole pages from `start` on which `a` and `b` agree, up to `stop`."""
        if a.uid == b.uid:
            p = stop
        else:
            lim = min(stop, a.shared_len, b.shared_len)
            p, h = start, self.hash_tokens
            ha, hb = a.hashes, b.hashes
            while p < lim:
                blk = p // h
                if ha[blk] != hb[blk]:
                    break
                p = (blk + 1) * h
            p = min(p, lim)
        return start + (p - start) // self.page_size * self.page_size

    # --- match -------------------------------------------------------------------------------
    def match(self, c: Content, limit: int) -> tuple[int, Node]:
        """Longest cached prefix of `c`'s first `limit` tokens (whole pages): `(end, last_node)`.

        Splits a node where the match ends inside it; refreshes the access time of the path.
        """
        self.tick += 1
        tick = self.tick
        pos, node = self._descend(c, limit - limit % self.page_size, tick)
        self._touch(node, tick)
        return pos, node

    def _descend(self, c: Content, limit: int, tick: int) -> tuple[int, Node]:
        """Walk down from the root along `c`'s tokens [0, limit), stamping each child entered with
        `tick`; a match ending inside a node splits it there. Returns `(end of the match, its node)`."""
        node, pos = self.root, 0
        while pos < limit:
            child = node.children.get(self.key(c, pos))
            if child is None:
                break
            child.tick = tick
            end = self._match_end(child.content, c, pos, min(child.end, limit))
            if end < child.end:
                if end > pos:
                    node = self._split(child, end)
                    pos = end
                self._refreshed(child)
                break
            node, pos = child, end
        return pos, node

    def _touch(self, node: Node, tick: int) -> None:
        """Refresh `node` and its ancestors; an evictable leaf gets a heap entry for its new time."""
        node.tick = tick
        if node.lock_ref == 0 and not node.children and node is not self.root:
            self._push(node)
        n = node.parent
        while n is not None:
            n.tick = tick
            n = n.parent

    def _refreshed(self, node: Node) -> None:
        """`node`'s time changed: an evictable leaf needs a heap entry at the new time."""
        if node.lock_ref == 0 and not node.children:
            self._push(node)

    def path_pages(self, node: Node) -> list:
        """Pool pages of the path root -> `node`, in position order."""
        parts = []
        while node is not self.root:
            parts.append(node.pages)
            node = node.parent
        out: list = []
        for p in reversed(parts):
            out += p
        return out

    def _split(self, child: Node, at: int) -> Node:
        """Cut `child` at position `at`: a new node [child.start, at) above it; returns the new node."""
        k = (at - child.start) // self.page_size
        parent = child.parent
        new = Node(parent, child.content, child.start, at, None, self._next_id())
        self.num_nodes += 1
        if self.store_pages:
            new.pages = child.pages[:k]
            child.pages = child.pages[k:]
        new.lock_ref = child.lock_ref
        new.tick = child.tick
        parent.children[self.key(child.content, child.start)] = new
        child.start = at
        child.parent = new
        new.children[self.key(child.content, at)] = child
        return new

    # --- insert ------------------------------------------------------------------------------
    def insert(self, c: Content, end: int, pages: list | None) -> tuple[int, Node]:
        """Insert `c`'s tokens [0, end) (whole pages); `pages` are the caller's pages for them.

        Returns `(prefix_end, node)`: positions [0, prefix_end) were in the tree already (the
        caller's pages for them are duplicates, theirs to free), and the node where `end` ends.
        A new leaf takes `pages[prefix_end // page_size:]`, unlocked (evictable).
        """
        self.tick += 1
        tick = self.tick
        end -= end % self.page_size
        pos, node = self._descend(c, end, tick)
        prefix = pos
        if pos < end:
            leaf = Node(node, c, pos, end, None, self._next_id())
            self.num_nodes += 1
            if self.store_pages:
                leaf.pages = pages[pos // self.page_size: end // self.page_size]
            leaf.tick = tick
            node.children[self.key(c, pos)] = leaf
            self.evictable_tokens += end - pos
            node = leaf
        self._touch(node, tick)
        return prefix, node

    # --- locks -------------------------------------------------------------------------------
    def inc_lock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                n = node.end - node.start
                self.evictable_tokens -= n
                self.protected_tokens += n
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref == 1:
                n = node.end - node.start
                self.evictable_tokens += n
                self.protected_tokens -= n
                if not node.children:
                    self._push(node)
            node.lock_ref -= 1
            node = node.parent

    # --- eviction ----------------------------------------------------------------------------
    def _live_leaf(self, tick: int, node: Node) -> bool:
        return (node.tick == tick and node.lock_ref == 0 and not node.children and node.parent is not None
                and node.parent.children.get(self.key(node.content, node.start)) is node)

    def evict(self, num_tokens: int, free_pages: Callable[[list], None],
              evicted: Callable[[Node], None] | None = None) -> int:
        """Evict least recently used unlocked leaves until `num_tokens` tokens are freed (or none
        is left); their pages go to `free_pages`, and each leaf to `evicted` first, while its path
        from the root still holds its ancestors' pages. Returns the tokens evicted."""
        heap = self._heap
        done = 0
        while done < num_tokens and heap:
            tick, _, node = heapq.heappop(heap)
            if not self._live_leaf(tick, node):
                continue
            if evicted is not None:
                evicted(node)
            parent = node.parent
            del parent.children[self.key(node.content, node.start)]
            node.parent = None
            n = node.end - node.start
            self.evictable_tokens -= n
            self.evicted_tokens += n
            self.evicted_nodes += 1
            done += n
            free_pages(node.pages)
            self.num_nodes -= 1
            if parent is not self.root and parent.lock_ref == 0 and not parent.children:
                heapq.heappush(heap, (parent.tick, parent.id, parent))
        return done

    # --- checks ------------------------------------------------------------------------------
    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())
