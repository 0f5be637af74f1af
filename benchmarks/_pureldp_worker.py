"""Runs pure-ldp's frequency oracles (in its own venv) for benchmarks/ldp_oracles.py.

Reads a JSON job on stdin: {"epsilon", "d", "counts", "runs", "seed"}; prints JSON
{oracle: [[estimated count per category] per run]}. Items are 1..d (pure-ldp's default
index mapping). Not part of dpsql: pure-ldp is only installed in a throwaway venv.
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import xxhash

_xxh32 = xxhash.xxh32


def _xxh32_accepting_str(data: object = b"", seed: int = 0) -> object:
    """pure-ldp 1.2.0 hashes ``str``; xxhash >= 2 wants bytes. Encode, as xxhash 1.x did."""
    return _xxh32(data.encode() if isinstance(data, str) else data, seed=seed)


xxhash.xxh32 = _xxh32_accepting_str  # a compatibility shim for pure-ldp, not a change to it

from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer  # noqa: E402
from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer  # noqa: E402
from pure_ldp.frequency_oracles.unary_encoding import UEClient, UEServer  # noqa: E402


def _oracles(epsilon: float, d: int) -> dict[str, tuple[object, object]]:
    return {
        "DE (GRR)": (DEClient(epsilon, d), DEServer(epsilon, d)),
        "SUE": (UEClient(epsilon, d, use_oue=False), UEServer(epsilon, d, use_oue=False)),
        "OUE": (UEClient(epsilon, d, use_oue=True), UEServer(epsilon, d, use_oue=True)),
        "BLH": (LHClient(epsilon, d, g=2), LHServer(epsilon, d, g=2)),
        "OLH": (LHClient(epsilon, d, use_olh=True), LHServer(epsilon, d, use_olh=True)),
    }


def main() -> None:
    job = json.load(sys.stdin)
    epsilon, d, counts, runs = job["epsilon"], job["d"], job["counts"], job["runs"]
    random.seed(job["seed"])
    np.random.seed(job["seed"])
    items = [i + 1 for i, c in enumerate(counts) for _ in range(c)]
    out: dict[str, list[list[float]]] = {}
    for name in _oracles(epsilon, d):
        estimates = []
        for _ in range(runs):
            client, server = _oracles(epsilon, d)[name]
            for item in items:
                server.aggregate(client.privatise(item))  # type: ignore[attr-defined]
            estimates.append([float(x) for x in server.estimate_all(range(1, d + 1), suppress_warnings=True)])  # type: ignore[attr-defined]
        out[name] = estimates
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
