"""The torch sampler's prefix cache: the KV of contexts it has fed, kept for a later call
that continues one, which then feeds only the tokens that follow (vLLM's automatic prefix
caching does the same per block; here an entry is one row's whole context).

    generate(contexts)  -> each row's KV as it ends (prompt + its tokens but the last,
                           what it fed), stored by those tokens
    next turn: context = that + the last token + the observations
    generate(contexts)  -> the longest stored prefix of each is taken (removed: the
                           continuation stores the longer one) and only the rest is fed

The rows that end at one decode step are copied out together, and their entries are views
of that one copy: the bytes held are those of the copies still referenced (counted once
each). Entries are kept least recently stored first out past ``capacity`` bytes, and only under
the weights they were computed with: every load (``invalidate``) drops them all, as vLLM's
cache is reset after each weight sync, and an entry stored by a call that began under
earlier weights is refused.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import torch

KV = tuple[torch.Tensor, ...]


class PrefixCache:
    def __init__(self, capacity: int):
        self.capacity = capacity            # bytes
        self.used = 0                       # bytes of the storages the entries view
        self.epoch = 0                      # weight loads seen
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._lengths: Counter[int] = Counter()     # entries of each context length
        self._storages: dict[int, list[int]] = {}   # data_ptr -> [nbytes, entries on it]

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: tuple[int, ...], kv: KV, epoch: int) -> None:
        """``kv``: the KV of ``tokens`` (views of a copy no one else writes), computed
        under the weights of ``epoch``."""
        if epoch != self.epoch or _nbytes(kv) > self.capacity:
            return
        self._drop(tokens)
        self._entries[tokens] = kv
        self._lengths[len(tokens)] += 1
        for t in kv:
            held = self._storages.setdefault(t.untyped_storage().data_ptr(),
                                             [t.untyped_storage().nbytes(), 0])
            self.used += held[0] * (held[1] == 0)
            held[1] += 1
        while self.used > self.capacity:
            self._drop(next(iter(self._entries)))

    def take(self, context: list[int]) -> tuple[int, KV] | None:
        """The longest stored proper prefix of ``context`` (one token at least is left to
        feed: its logits are what the call samples from), and its KV; removed."""
        for n in sorted(self._lengths, reverse=True):
            if n < len(context):
                key = tuple(context[:n])
                if key in self._entries:
                    kv = self._entries[key]
                    self._drop(key)
                    return n, kv
        return None

    def invalidate(self) -> int:
        """The weights changed: every entry is stale. Returns the bytes released."""
        released = self.used
        self._entries.clear()
        self._lengths.clear()
        self._storages.clear()
        self.used = 0
        self.epoch += 1
        return released

    def _drop(self, tokens: tuple[int, ...]) -> None:
        kv = self._entries.pop(tokens, None)
        if kv is None:
            return
        self._lengths[len(tokens)] -= 1
        if not self._lengths[len(tokens)]:
            del self._lengths[len(tokens)]
        for t in kv:
            ptr = t.untyped_storage().data_ptr()
            held = self._storages[ptr]
            held[1] -= 1
            if not held[1]:
                self.used -= held[0]
                del self._storages[ptr]


def _nbytes(kv: KV) -> int:
    """The bytes of the storages ``kv`` views (each once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in kv}.values())
