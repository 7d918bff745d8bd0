"""Memory the extender keeps across requests, bounded by bytes rather than by entries.

Requests come from kube-scheduler, but anything that can reach the port can send them:
a store bounded only by its number of entries grows with the size of what it keeps
(60 requests with 8 MB pod names once took the process from 129 to 596 MB). A
:class:`ByteLRU` keeps an estimate of the bytes it holds and drops its oldest entries
when a budget is exceeded; an entry larger than the whole budget is not kept at all.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Generic, Hashable, Iterator, TypeVar


__all__ = ["ByteLRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: bookkeeping of one entry (the ordered dict's node, the key's hash slot)
ENTRY_OVERHEAD = 120


class ByteLRU(Generic[K, V]):
    """A least-recently-used map holding at most ``max_entries`` entries and about
    ``max_bytes`` bytes (the caller gives each entry's size)."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        if max_bytes < 1 or max_entries < 1:
            raise ValueError("max_bytes and max_entries must be positive")
        self.max_bytes = int(max_bytes)
        self.max_entries = int(max_entries)
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        #: entries refused because one alone was over the budget
        self.refused = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def get(self, key: K, default: Any = None, *, touch: bool = True) -> V | Any:
        item = self._items.get(key)
        if item is None:
            return default
        if touch:
            self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, size: int) -> bool:
        """Keep ``value`` under ``key`` (replacing any old one); ``size`` is the bytes of
        both. ``False`` when the entry alone is larger than the budget and was not kept."""
        self.pop(key)
        size = int(size) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            self.refused += 1
            return False
        self._items[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes or len(self._items) > self.max_entries:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old
        return True

    def pop(self, key: K, default: Any = None) -> V | Any:
        item = self._items.pop(key, None)
        if item is None:
            return default
        self.bytes -= item[1]
        return item[0]

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
