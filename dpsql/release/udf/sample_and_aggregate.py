"""Sample-and-aggregate: any function, answered with pure epsilon-DP (DESIGN §5).

Units are hashed into ``k`` disjoint blocks (all of a unit's rows in one block), ``fn``
runs on each block, each result is clipped into ``[lo, hi]``, and the mean of the ``k``
results is released with Laplace noise of sensitivity ``(hi - lo) / k``: adding or
removing one unit changes one block, so one clipped result, so the mean by at most
``(hi - lo) / k``. No row cap is needed for privacy (a unit with many rows still touches
one block); the caller may still cap rows to keep blocks small.

**What the caller supplies.** ``values`` (one float per row, any order) and ``block_ids``
(the row's block in ``[0, k)``, a keyed hash of its unit: see :func:`assign_blocks`, or
``hash(unit, salt) % k`` in SQL), and ``k`` itself, chosen by :func:`choose_block_count`
from a *public or differentially private* unit count: ``k`` must not depend on the exact
data, or the neighbouring databases would be split differently.
Rows whose value is NULL (absent), NaN or +-inf are dropped: ``fn`` sees finite float64
values only.

**Choosing k.** The error has two parts: noise, mean absolute ``(hi - lo) / (k epsilon)``,
falling with k; and block bias, since ``fn`` on ``m = n / k`` units is biased for any
non-linear statistic by about ``c (hi - lo) / m = c (hi - lo) k / n``, rising with k
(averaging the k blocks removes their variance, not their bias). Their sum is smallest at
``k = sqrt(n / (c epsilon))``, and we keep at least ``MIN_BLOCK_UNITS`` units per block.
We take ``c = 1/4``, from the block bias measured on the demo incomes (c = bias * n /
(k (hi - lo)), roughly constant in k from 100 to 3000 blocks): the mean has c ~ 0; the
median 0.1-0.2 with one value or up to 10 rows per user, 0.3-0.4 with all rows; a
10%-90% trimmed mean 0.05 per user, 0.3 with 10 rows per user, 1.1 with all rows (a
user's many identical rows crowd a small block). On the demo data (100k users, epsilon
1) the rule gives k = 632 blocks of about 160 users.

**Faults.** A block whose ``fn`` raises, returns something that is not a finite real
number, or runs longer than ``time_limit`` seconds contributes the documented default,
the midpoint of the bounds; the query never fails because of ``fn``. Each block's outcome
depends only on that block (its own run time against its own limit), so one unit still
changes at most one block's contribution.

With ``isolation="process"`` (the default where ``os.fork`` exists) the blocks run in a
forked worker process: a block past its limit is killed (SIGKILL) and a new worker goes
on with the next block, so a function that loops forever, calls ``os._exit`` or crashes
the interpreter costs one block, not the server; ``fn`` cannot change the server's state.
With ``isolation="inline"`` blocks run in the calling thread (faster, for trusted
functions and tests): exceptions are caught and a slow block still gets the default, but
it cannot be interrupted.
dpsql's own quantile (:class:`~dpsql.release.udf.block_quantile.BlockQuantile`, for MEDIAN and
PERCENTILE_CONT) is no analyst's code: it runs inline, every block at once (issue 16).

**Timing.** A failed block costs the same wherever it sits: its run time up to the limit
(a timeout: the limit, a small grace period and one fork, a few ms). So the total time
does not depend on *which* block failed. It does depend on the sum over blocks of
``min(run time, limit)``, which a hostile function can make data-dependent. With
``pad_time=True`` every call takes at least ``k * time_limit`` seconds (the most the blocks
can take without restarts), which makes the duration independent of the data except when
blocks time out back to back; that costs latency, so it is off by default.
"""

from __future__ import annotations

import math
import os
import secrets
import select
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError
from dpsql.plan import DEFAULT_TIME_LIMIT  # seconds one block may run before it gets the default
from dpsql.noise import RandomSource, laplace_noise
from dpsql.release.udf.block_quantile import BlockQuantile
from dpsql.release.udf._release import (
    CONFIDENCE,
    FloatArray,
    UDFRelease,
    check_bounds,
    check_budget,
    clamp,
    exponent_for,
    midpoint,
)

__all__ = [
    "BLOCK_STATUS",
    "DEFAULT_TIME_LIMIT",
    "BlockOutcome",
    "assign_blocks",
    "choose_block_count",
    "evaluate_blocks",
    "expected_error",
    "sample_and_aggregate",
]

Isolation = Literal["process", "inline"]
BlockFunction = Callable[[FloatArray], object]

#: The block bias constant c of the k rule (see the module docstring).
DEFAULT_BIAS_CONSTANT = 1 / 4
#: Blocks keep at least this many units (when there are that many).
MIN_BLOCK_UNITS = 10
#: At most this many blocks: per-block fixed-point values (< 2**40) then sum within int64.
MAX_BLOCKS = 1 << 22
#: Fixed-point bits of a clipped block result, and bits of the release lattice per range.
_VALUE_BITS = 40
_RELEASE_BITS = 12

OK, RAISED, NON_FINITE, BAD_TYPE, TIMED_OUT, CRASHED = range(6)
#: Block status codes, by name, as found in ``BlockOutcome.status``.
BLOCK_STATUS = ("ok", "raised", "non_finite", "bad_type", "timed_out", "crashed")
#: The parent reads worker records at most this often (its deadlines may run this late).
_BATCH_WAIT = 0.002
#: One worker -> parent record per block: index, value, status (17 bytes, atomic on a pipe).
_RECORD = struct.Struct("<qdb")


# ------------------------------------------------------------------------ choosing k


def choose_block_count(n_estimate: float, epsilon: float, *,
                       bias_constant: float = DEFAULT_BIAS_CONSTANT,
                       min_block_units: int = MIN_BLOCK_UNITS) -> int:
    """The number of blocks k for about ``n_estimate`` units at ``epsilon``.

    ``k = round(sqrt(n / (c epsilon)))``, at most ``n / min_block_units`` and at least 1
    (see the module docstring). ``n_estimate`` must be public or differentially private,
    e.g. a noisy ``COUNT(DISTINCT unit)``: the exact count would leak through k.

    >>> choose_block_count(100_000, 1.0)
    632
    >>> choose_block_count(50, 1.0), choose_block_count(0, 1.0)
    (5, 1)
    """
    check_budget(epsilon, 0.0, need_delta=False, mechanism="sample-and-aggregate")
    if not bias_constant > 0 or min_block_units < 1:
        raise InternalError("choose_block_count needs bias_constant > 0 and "
                            "min_block_units >= 1.")
    n = max(0.0, float(n_estimate)) if math.isfinite(n_estimate) else 0.0
    k = round(math.sqrt(n / (bias_constant * epsilon)))
    return int(max(1, min(k, int(n // min_block_units), MAX_BLOCKS)))


def expected_error(bounds: tuple[float, float], n_estimate: float, epsilon: float, *,
                   k: int | None = None, bias_constant: float = DEFAULT_BIAS_CONSTANT) -> float:
    """Model of the mean absolute error: noise ``(hi-lo)/(k eps)`` + bias ``c (hi-lo) k/n``.

    A model, not a measurement: it uses no data, so it may steer strategy choice.

    >>> round(expected_error((0, 100), 100_000, 1.0), 4)
    0.3162
    """
    lo, hi = check_bounds(bounds)
    k = choose_block_count(n_estimate, epsilon, bias_constant=bias_constant) if k is None else k
    n = max(float(n_estimate), 1.0)
    return (hi - lo) / (k * epsilon) + min(bias_constant * (hi - lo) * k / n, (hi - lo) / 2)


def assign_blocks(unit_ids: npt.ArrayLike, k: int, salt: int | None = None) -> npt.NDArray[np.int64]:
    """A block in ``[0, k)`` for each row, from a keyed hash of its integer unit id.

    Rows of one unit always share a block. ``salt`` (64 bits) defaults to a fresh secret,
    so the split is new for every query. The hash is splitmix64 keyed twice; the block of a
    unit depends on nothing but the unit and the salt, which is all privacy needs.

    >>> blocks = assign_blocks([7, 7, 8, 9], 4, salt=1)
    >>> bool(blocks[0] == blocks[1]) and bool((blocks < 4).all())
    True
    """
    if not 1 <= k <= MAX_BLOCKS:
        raise InternalError(f"k must be in [1, {MAX_BLOCKS}], got {k}.")
    units = np.asarray(unit_ids)
    if units.dtype.kind not in "iu":
        raise InternalError(f"assign_blocks needs integer unit ids, got {units.dtype}; "
                            "hash other keys in SQL.")
    key = secrets.randbits(64) if salt is None else salt & (2**64 - 1)
    h = _splitmix64(units.astype(np.int64).view(np.uint64) ^ np.uint64(key))
    h = _splitmix64(h + np.uint64((key * 0x9E3779B97F4A7C15) & (2**64 - 1)))
    return (h % np.uint64(k)).astype(np.int64)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


# --------------------------------------------------------------------- running blocks


@dataclass(frozen=True)
class BlockOutcome:
    """What the blocks returned. PRIVATE: statuses and times depend on the data.

    Attributes:
        values: per block, ``fn``'s result, or the default where the block failed.
        status: per block, an index into :data:`BLOCK_STATUS`.
        elapsed: wall seconds spent, padding included.
        isolation: how the blocks actually ran ("process" or "inline").
    """

    values: FloatArray
    status: npt.NDArray[np.int8]
    elapsed: float
    isolation: Isolation

    def failures(self) -> dict[str, int]:
        """How many blocks ended in each non-ok status."""
        counts = np.bincount(self.status, minlength=len(BLOCK_STATUS))
        return {BLOCK_STATUS[i]: int(counts[i]) for i in range(1, len(BLOCK_STATUS)) if counts[i]}


def evaluate_blocks(fn: BlockFunction, values: npt.ArrayLike, block_ids: npt.ArrayLike, k: int, *,
                    default: float, time_limit: float = DEFAULT_TIME_LIMIT,
                    isolation: Isolation = "process", pad_time: bool = False) -> BlockOutcome:
    """Run ``fn`` on each of the ``k`` blocks; failures get ``default``, never an exception.

    Args:
        fn: takes one block's values (a read-only float64 array, possibly empty).
        values: one float per row.
        block_ids: the row's block, integers in ``[0, k)``.
        k: number of blocks.
        default: what a failed block contributes.
        time_limit: seconds one block may take.
        isolation: "process" (forked worker, killable) or "inline".
        pad_time: take at least ``k * time_limit`` seconds in total.

    >>> out = evaluate_blocks(lambda b: 1 / len(b), [1.0, 2.0, 3.0], [0, 0, 2], 3,
    ...                       default=-1.0, isolation="inline")
    >>> out.values.tolist(), out.failures()
    ([0.5, -1.0, 1.0], {'raised': 1})
    """
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise InternalError(f"time_limit must be a finite number of seconds > 0, got "
                            f"{time_limit!r}.")
    array, ids = _checked(values, block_ids, k)
    quantile = isinstance(fn, BlockQuantile)
    data, offsets = (array, np.zeros(0, dtype=np.int64)) if quantile else _blocks(array, ids, k)
    started = time.monotonic()
    out = np.full(k, math.nan)
    status = np.zeros(k, dtype=np.int8)
    used: Isolation = isolation if isolation == "inline" or hasattr(os, "fork") else "inline"
    if isinstance(fn, BlockQuantile):  # dpsql's own quantile: every block at once, inline
        used = "inline"
        out = fn.by_block(array, ids, k)
        status[~np.isfinite(out)] = NON_FINITE
    elif used == "process":
        _run_forked(fn, data, offsets, time_limit, out, status)
    else:
        for i in range(k):
            out[i], status[i] = _call_block(fn, data[offsets[i]:offsets[i + 1]], time_limit, Exception)
    out[status != OK] = default
    if pad_time:
        _sleep_until(started + k * time_limit)
    return BlockOutcome(out, status, time.monotonic() - started, used)


def _checked(values: npt.ArrayLike, block_ids: npt.ArrayLike, k: int) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """``values`` as float64 and ``block_ids`` as int64, checked."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_BLOCKS:
        raise InternalError(f"k must be an integer in [1, {MAX_BLOCKS}], got {k!r}.")
    array = np.asarray(values, dtype=np.float64)
    ids = np.asarray(block_ids)
    if array.ndim != 1 or ids.shape != array.shape or (ids.size and ids.dtype.kind not in "iu"):
        raise InternalError(f"values and block_ids must be 1-D of one length, block_ids "
                            f"integers; got {array.shape} and {ids.dtype} {ids.shape}.")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= k):
        raise InternalError(f"block ids must be in [0, {k}).")
    return array, ids


def _blocks(array: FloatArray, ids: npt.NDArray[np.int64], k: int) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Values sorted by block (read-only) and the offsets of each block."""
    order = np.argsort(ids, kind="stable")
    data = array[order]
    data.flags.writeable = False
    offsets = np.searchsorted(ids[order], np.arange(k + 1), side="left").astype(np.int64)
    return data, offsets


def _as_real(raw: object) -> float | None:
    """``raw`` as a float if it is a real number (not a bool), else None."""
    if isinstance(raw, (bool, np.bool_)) or not isinstance(raw, (int, float, np.integer, np.floating)):
        return None
    return float(raw)


def _call_block(fn: BlockFunction, block: FloatArray, time_limit: float,
                catch: type[BaseException]) -> tuple[float, int]:
    """``(value, status)`` of one block; the conversion to float is timed too."""
    started = time.perf_counter()
    try:
        value = _as_real(fn(block))
    except catch:
        return math.nan, RAISED
    if time.perf_counter() - started > time_limit:
        return math.nan, TIMED_OUT
    if value is None:
        return math.nan, BAD_TYPE
    return (value, OK) if math.isfinite(value) else (math.nan, NON_FINITE)


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


#: Extra wall time the parent allows a block before killing the worker: covers pipe latency
#: and scheduling. A block slower than the limit is a timeout either way (the worker checks).
def _grace(time_limit: float) -> float:
    return 0.02 + 0.1 * time_limit


def _run_forked(fn: BlockFunction, data: FloatArray, offsets: npt.NDArray[np.int64],
                time_limit: float, out: FloatArray, status: npt.NDArray[np.int8]) -> None:
    """Run every block in forked workers; a worker killed or dead costs its current block."""
    k = len(offsets) - 1
    start = 0
    while start < k:
        start = _run_worker(fn, data, offsets, start, time_limit, out, status)


def _run_worker(fn: BlockFunction, data: FloatArray, offsets: npt.NDArray[np.int64], start: int,
                time_limit: float, out: FloatArray, status: npt.NDArray[np.int8]) -> int:
    """Fork one worker for blocks ``start..k-1``; return the next block still to run."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns, never runs the parent's exit handlers
        code = 0
        try:
            os.close(read_fd)
            _worker_loop(fn, data, offsets, start, time_limit, write_fd)
        except BaseException:  # noqa: BLE001 - the worker must reach os._exit
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        return _collect(read_fd, pid, start, len(offsets) - 1, time_limit + _grace(time_limit), out, status)
    finally:
        os.close(read_fd)
        _reap(pid)


def _worker_loop(fn: BlockFunction, data: FloatArray, offsets: npt.NDArray[np.int64], start: int,
                 time_limit: float, fd: int) -> None:
    for i in range(start, len(offsets) - 1):
        value, code = _call_block(fn, data[offsets[i]:offsets[i + 1]], time_limit, BaseException)
        os.write(fd, _RECORD.pack(i, value, code))


def _collect(fd: int, pid: int, start: int, k: int, allowance: float,
             out: FloatArray, status: npt.NDArray[np.int8]) -> int:
    """Read block records until all are in, the worker dies, or a block overstays."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    pending = b""
    expected = start
    block_started = time.monotonic()
    while expected < k:
        wait = max(0.0, block_started + allowance - time.monotonic())
        if not poller.poll(math.ceil(wait * 1000)):
            status[expected] = TIMED_OUT
            _kill(pid)
            return expected + 1
        chunk = os.read(fd, 1 << 16)
        if not chunk:  # the worker died inside this block
            status[expected] = CRASHED
            return expected + 1
        block_started = time.monotonic()
        pending += chunk
        whole = len(pending) - len(pending) % _RECORD.size
        for index, value, code in _RECORD.iter_unpack(pending[:whole]):
            if index != expected:
                raise InternalError(f"block worker sent block {index}, expected {expected}.")
            out[index], status[index] = value, code
            expected += 1
        pending = pending[whole:]
        if expected < k:  # let records pile up: one wake-up per batch, not per block
            time.sleep(min(_BATCH_WAIT, max(0.0, block_started + allowance - time.monotonic())))
    return k


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


# ------------------------------------------------------------------------- the release


def sample_and_aggregate(fn: BlockFunction, values: npt.ArrayLike, block_ids: npt.ArrayLike, k: int,
                         bounds: tuple[float, float], epsilon: float, *,
                         time_limit: float = DEFAULT_TIME_LIMIT, isolation: Isolation = "process",
                         pad_time: bool = False, source: RandomSource | None = None) -> UDFRelease:
    """Release the mean of ``fn`` over ``k`` blocks, clipped into ``bounds``, epsilon-DP.

    Exact arithmetic (DESIGN §5): each clipped block result ``a`` becomes the integer
    ``round((a - lo) / g)``, ``g = 2**e`` with ``(hi - lo) / g`` about ``2**40``; the integer
    sum is exact; it is floored by ``shift`` bits to a lattice of about ``2**12`` steps per
    ``hi - lo``, gets discrete Laplace noise for the integer sensitivity
    ``ceil(round((hi - lo) / g) / 2**shift)``, and only then is divided by ``k``
    (post-processing) and clamped into the bounds.

    Args:
        fn: the statistic; takes one block's finite float64 values, returns a float.
        values: one value per row (NULL rows left out; NaN and +-inf are dropped here).
        block_ids: each row's block in ``[0, k)``, all rows of a unit in one block.
        k: number of blocks, from :func:`choose_block_count` on a public/DP unit count.
        bounds: ``(lo, hi)``: block results are clipped into it; failures give the midpoint.
        epsilon: the whole epsilon of this release (delta is 0). With GROUP BY, a unit in
            up to L0 groups changes L0 releases: pass ``epsilon / L0`` to each.
        time_limit, isolation, pad_time: see :func:`evaluate_blocks`.
        source: randomness for the noise (the system CSPRNG by default).

    >>> from dpsql.noise import SeededRandom
    >>> values = [float(v % 10) for v in range(1000)]
    >>> r = sample_and_aggregate(lambda b: float(b.mean()), values, [v % 10 for v in range(1000)],
    ...                          10, (0, 10), 1.0, isolation="inline", source=SeededRandom(1))
    >>> r.mechanism, r.parameters["blocks"], abs(r.value - 4.5) < 10
    ('sample_and_aggregate', 10, True)
    """
    lo, hi = check_bounds(bounds)
    check_budget(epsilon, 0.0, need_delta=False, mechanism="sample-and-aggregate")
    array = np.asarray(values, dtype=np.float64)
    ids = np.asarray(block_ids)
    if array.shape != ids.shape:
        raise InternalError(f"values {array.shape} and block_ids {ids.shape} differ in shape.")
    finite = np.isfinite(array)
    default = midpoint(lo, hi)
    outcome = evaluate_blocks(fn, array[finite], ids[finite], k, default=default,
                              time_limit=time_limit, isolation=isolation, pad_time=pad_time)
    results = np.clip(outcome.values, lo, hi)
    value, lattice, scale, half_width = _noisy_mean(results, lo, hi, epsilon, source)
    return UDFRelease(
        value=value, mechanism="sample_and_aggregate", epsilon=float(epsilon), delta=0.0,
        lattice=lattice, noise_scale=scale, half_width=half_width,
        parameters={"blocks": k, "bounds": (lo, hi), "sensitivity": (hi - lo) / k,
                    "default": default, "time_limit": time_limit, "isolation": outcome.isolation},
        diagnostics={"failures": outcome.failures(), "elapsed": outcome.elapsed,
                     "exact_mean": float(results.mean())},
    )


def _noisy_mean(results: FloatArray, lo: float, hi: float, epsilon: float,
                source: RandomSource | None) -> tuple[float, float, float, float]:
    """``(value, lattice, noise scale, half-width)`` of the noisy mean of clipped results."""
    k = len(results)
    e = exponent_for(hi - lo, _VALUE_BITS)
    top = round(math.ldexp(hi - lo, -e))  # (hi - lo) in fixed-point steps, < 2**40
    steps = np.clip(np.rint(np.ldexp(results - lo, -e)), 0, top).astype(np.int64)
    total = int(steps.sum())
    shift = max(0, top.bit_length() - _RELEASE_BITS - 1)
    sensitivity = -(-top >> shift)
    noise = laplace_noise(sensitivity, epsilon)
    noisy = (total >> shift) + int(noise.sample(1, source)[0])
    step = math.ldexp(1.0, e + shift)  # one release-lattice step of the sum
    value = clamp(lo + noisy * step / k, lo, hi)
    return value, step / k, noise.scale * step / k, noise.quantile_abs(CONFIDENCE) * step / k
