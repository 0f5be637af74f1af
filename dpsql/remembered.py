"""What a process remembers for its connections, bounded across them all (issue 16).

A server's front keeps one :class:`~dpsql.connection.Connection` per analyst, each
remembering plans by exact question and templates (:class:`~dpsql.plancache.PlanCache`),
each in a :class:`Memo`. Every full garbage collection scans every object they
all hold, and stops the process that hands queries to workers and releases answers at
their deadlines. A bound per connection grows with the analysts; a :class:`Bound` is one
over all of a process's caches of one kind: the oldest entry of any of them goes first.

Measured (a scratch script: N connections planning M distinct templates each, then
``gc.collect``; HISTORY.md, 2026-12-07): 64 analysts x 32 templates, 226,908 tracked
objects and a 152 ms collection with the templates bounded alone, most of it the 2,048
plans remembered 32 a connection.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["Bound", "Memo"]

_V = TypeVar("_V")


class _Owner(Protocol):
    def _drop(self, key: Hashable) -> None: ...


class Bound:
    """At most ``size`` entries over every cache that joins it, oldest first.

    A cache calls :meth:`added` for each new entry (outside its own lock) and drops the
    entries it is handed back; :meth:`forget` when it is cleared. A cache that is collected
    without being cleared leaves the bound at the next :meth:`added`.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._order: OrderedDict[tuple[int, Hashable], None] = OrderedDict()
        self._caches: dict[int, weakref.ref[_Owner]] = {}
        self._ids = itertools.count()
        self._gone: list[int] = []  # caches collected since: their entries go at the next add

    def join(self, cache: _Owner) -> int:
        """A new cache's number. (The weak reference's callback only notes a collected
        cache: it can run inside any allocation, this lock held.)"""
        with self._lock:
            number = next(self._ids)
            self._caches[number] = weakref.ref(cache, lambda _: self._gone.append(number))
        return number

    def added(self, number: int, key: Hashable, dropped: Hashable | None = None) -> list[tuple[_Owner, Hashable]]:
        """Cache ``number`` remembered ``key`` (and dropped its own ``dropped``); the
        (cache, key) pairs now over the bound, for their caches to drop."""
        over = []
        with self._lock:
            while self._gone:
                gone = self._gone.pop()
                self._caches.pop(gone, None)
                self._purge(gone)
            if dropped is not None:
                self._order.pop((number, dropped), None)
            self._order[(number, key)] = None
            while len(self._order) > self.size:
                (owner, oldest), _ = self._order.popitem(last=False)
                ref = self._caches.get(owner)
                cache = ref() if ref is not None else None
                if cache is not None:
                    over.append((cache, oldest))
        return over

    def forget(self, number: int) -> None:
        """Cache ``number`` was cleared."""
        with self._lock:
            self._purge(number)

    def _purge(self, number: int) -> None:
        for entry in [e for e in self._order if e[0] == number]:
            del self._order[entry]

    def __len__(self) -> int:
        return len(self._order)


class Memo(Generic[_V]):
    """One connection's values by key, at most ``size`` and within ``bound`` (shared by the
    process's connections), oldest dropped first; ``dropped(value)`` is called for each
    value dropped (on the thread that made room for another)."""

    def __init__(self, size: int, bound: Bound, dropped: Callable[[_V], None] | None = None) -> None:
        self._size = size
        self._bound = bound
        self._dropped = dropped
        self._values: dict[Hashable, _V] = {}
        self._lock = threading.Lock()
        self._number = bound.join(self)

    def get(self, key: Hashable) -> _V | None:
        return self._values.get(key)

    def put(self, key: Hashable, value: _V) -> None:
        with self._lock:
            new = key not in self._values
            oldest = next(iter(self._values)) if new and len(self._values) >= self._size else None
            old = self._values.pop(oldest) if oldest is not None else None
            self._values[key] = value
        if old is not None and self._dropped is not None:
            self._dropped(old)
        if new:
            for owner, over in self._bound.added(self._number, key, oldest):
                owner._drop(over)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
        self._bound.forget(self._number)

    def _drop(self, key: Hashable) -> None:
        with self._lock:
            value = self._values.pop(key, None)
        if value is not None and self._dropped is not None:
            self._dropped(value)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._values))
