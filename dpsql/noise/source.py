"""Where noise gets its randomness (:class:`RandomSource`), and exact uniform integers.

:class:`SystemRandom` (``os.urandom``) in production, :class:`SeededRandom` in unit tests
only.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError
from dpsql.noise._checks import _INT64_MAX, _check_count, _check_int

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
UIntArray = npt.NDArray[np.unsignedinteger]
_UINT_DTYPES: dict[int, type[np.unsignedinteger]] = {16: np.uint16, 32: np.uint32, 64: np.uint64}


# ---------------------------------------------------------------------------- randomness


class RandomSource(Protocol):
    """Where noise gets its randomness: independent uniform 64-bit words."""

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` iid uniform uint64 words (callers must not write to the array)."""
        ...


class SystemRandom:
    """The production source: the operating system's CSPRNG (``os.urandom``).

    Small requests are served from a buffer refilled by one large ``os.urandom`` call;
    large requests read the kernel directly in one call. The buffer is per process: a
    forked child drops what it inherited, so parent and child never share noise.

    >>> SystemRandom().uint64(3).dtype
    dtype('uint64')
    """

    def __init__(self, chunk_bytes: int = 1 << 20) -> None:
        if chunk_bytes < 8 or chunk_bytes % 8:
            raise InternalError(f"SystemRandom chunk_bytes must be a positive multiple of 8, "
                                f"got {chunk_bytes}.")
        self._chunk = chunk_bytes
        self._lock = threading.Lock()
        self._buffer = b""
        self._position = 0
        self._pid = os.getpid()

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` uniform words from ``os.urandom``."""
        _check_count(n)
        size = 8 * n
        if size >= self._chunk:
            return np.frombuffer(os.urandom(size), dtype=np.uint64)
        with self._lock:
            if self._pid != os.getpid() or self._position + size > len(self._buffer):
                self._buffer, self._position, self._pid = os.urandom(self._chunk), 0, os.getpid()
            start, buffer = self._position, self._buffer
            self._position += size
        return np.frombuffer(buffer, dtype=np.uint64, count=n, offset=start)


class SeededRandom:
    """A reproducible source FOR UNIT TESTS ONLY: PCG64 is not cryptographically secure.

    Noise drawn from a known seed can be subtracted from a release; never use this class
    to answer queries.

    >>> bool((SeededRandom(7).uint64(4) == SeededRandom(7).uint64(4)).all())
    True
    """

    def __init__(self, seed: int) -> None:
        self._generator = np.random.Generator(np.random.PCG64(seed))

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` words from the seeded generator."""
        _check_count(n)
        words: npt.NDArray[np.uint64] = self._generator.bit_generator.random_raw(n)
        return words


#: The source used when a caller does not pass one.
default_source: RandomSource = SystemRandom()


def _random_uints(source: RandomSource, n: int, width: int) -> UIntArray:
    """``n`` uniform unsigned integers of ``width`` bits (16, 32 or 64), from packed words."""
    per_word = 64 // width
    count = -(-n // per_word)
    words = source.uint64(count)
    if words.dtype != np.uint64 or words.shape != (count,):
        raise InternalError(f"random source returned {words.dtype} {words.shape}, expected "
                            f"uint64 ({count},).")
    return words.view(_UINT_DTYPES[width])[:n]


def _random_bits(source: RandomSource, n: int) -> BoolArray:
    """``n`` fair coin flips, 64 per word."""
    words = _random_uints(source, -(-n // 64), 64)
    return np.unpackbits(words.view(np.uint8))[:n].view(np.bool_)


# ---------------------------------------------------------------------- exact primitives


def uniform_below(source: RandomSource, bound: int | IntArray, n: int) -> IntArray:
    """Exactly uniform integers in ``[0, bound)``, by rejection (no modulo bias).

    A draw ``u`` of w bits is kept only when ``u < 2**w - (2**w mod bound)``, a multiple
    of ``bound``; then ``u mod bound`` is exactly uniform. Bounds below ``2**12`` (``2**28``)
    use 16-bit (32-bit) draws, so at most 1/16 of draws are rejected and few bytes are read.

    Args:
        source: Where the random words come from.
        bound: One bound for all, or an int64 array of ``n`` bounds; ``1 <= bound < 2**63``.
        n: How many integers.

    Returns:
        An int64 array of ``n`` integers, element ``i`` uniform in ``[0, bound[i])``.

    >>> uniform_below(SeededRandom(1), 1, 3).tolist()
    [0, 0, 0]
    """
    _check_count(n)
    if isinstance(bound, np.ndarray):
        if bound.shape != (n,) or bound.dtype.kind not in "iu":
            raise InternalError(f"uniform_below needs {n} integer bounds, got {bound.dtype} "
                                f"{bound.shape}.")
        if n and (bound.min() < 1 or bound.max() > _INT64_MAX):
            raise InternalError("uniform_below bounds must be in [1, 2**63).")
        return _uniform_below_array(source, bound.astype(np.int64)).astype(np.int64)
    _check_int("bound", bound, 1, _INT64_MAX)
    return _uniform_below_scalar(source, int(bound), n).astype(np.int64)


def _width_for(bound: int) -> int:
    """The draw width (bits) used for bounds up to ``bound``: rejection stays below 1/16."""
    if bound <= 1 << 12:
        return 16
    return 32 if bound <= 1 << 28 else 64


def _small_ints(draws: UIntArray) -> npt.NDArray[np.integer]:
    """Reduced draws as a type that compares exactly with int64: uint16/uint32 as they are,
    uint64 (always below 2**63 here) reinterpreted as int64 for free."""
    return draws.view(np.int64) if draws.dtype == np.uint64 else draws


def _uniform_below_scalar(source: RandomSource, bound: int, n: int) -> npt.NDArray[np.integer]:
    """``uniform_below`` with one bound for every element, as uint16, uint32 or int64."""
    width = _width_for(bound)
    dtype = _UINT_DTYPES[width]
    modulus = dtype(bound)
    draws = _random_uints(source, n, width)
    out = draws % modulus
    limit = (1 << width) - (1 << width) % bound  # accept draws below this
    if limit < 1 << width:
        cap = dtype(limit - 1)
        redo = np.flatnonzero(draws > cap)
        while redo.size:
            draws = _random_uints(source, redo.size, width)
            ok = draws <= cap
            out[redo[ok]] = draws[ok] % modulus
            redo = redo[~ok]
    return _small_ints(out)


def _uniform_below_array(source: RandomSource, bounds: IntArray) -> npt.NDArray[np.integer]:
    """``uniform_below`` with one bound per element (``1 <= bounds < 2**63``)."""
    if bounds.size == 0:
        return np.zeros(0, dtype=np.int64)
    width = _width_for(int(bounds.max()))
    moduli = bounds.astype(_UINT_DTYPES[width])
    caps = ~(((~moduli) + 1) % moduli)  # 2**w - 1 - (2**w mod bound): accept draws <= cap
    draws = _random_uints(source, bounds.size, width)
    out = draws % moduli
    redo = np.flatnonzero(draws > caps)
    while redo.size:
        draws = _random_uints(source, redo.size, width)
        ok = draws <= caps[redo]
        kept = redo[ok]
        out[kept] = draws[ok] % moduli[kept]
        redo = redo[~ok]
    return _small_ints(out)
