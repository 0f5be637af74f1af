"""The SmartNoise SQL side of ``benchmarks/vs_smartnoise.py``; runs in its own virtualenv.

``vs_smartnoise.py`` starts this script with the Python of ``benchmarks/.venv-smartnoise``
(where ``smartnoise-sql`` is installed; dpsql never depends on it) and talks to it in JSON
lines: one request on stdin, one answer on stdout. Keeping one worker alive for the whole
run lets the parent interleave dpsql and SmartNoise runs, so that both see the same machine
load. Requests:

- ``{"cmd": "setup", "parquet": PATH, "reader": "sqlite"|"pandas", "income_scale": 1000,
  "epsilon": 1.0, "queries": {NAME: {"sql": SQL, "max_ids": 40}}}``: loads the data once
  into an in-memory SQLite database and builds one ``PrivateReader`` per query, each with
  the per-mechanism epsilon that makes SmartNoise's own ``get_privacy_cost`` of the query
  equal to ``epsilon``. Answers the load time, the versions, the cost, the mechanisms and the
  SQL SmartNoise runs for each query.
- ``{"cmd": "run", "name": NAME}``: runs the query once through SmartNoise; answers the wall
  and CPU seconds of ``PrivateReader.execute`` and the noisy rows.
- ``{"cmd": "quit"}``.

The protocol lines go to the real stdout; anything a library prints goes to stderr. This
file imports only the standard library at module level, so the parent can import
:class:`Progress` from it. SmartNoise code is called, not copied.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per 10 % otherwise."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label, self.total, self.done = label, max(total, 1), 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_decile = -1
        self._draw()

    def step(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        frac = self.done / self.total
        elapsed = time.perf_counter() - self.start
        eta = f"{elapsed / frac - elapsed:6.1f}s" if frac > 0 else "     ?"
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        text = f"{self.label:<34} [{bar}] {self.done}/{self.total} {elapsed:6.1f}s eta {eta}"
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
        elif int(10 * frac) != self._last_decile:
            self._last_decile = int(10 * frac)
            self.stream.write(text + "\n")
            self.stream.flush()


def metadata(max_ids: int, income_upper: float) -> dict[str, Any]:
    """SmartNoise metadata for ``visits`` (https://docs.smartnoise.org/sql/metadata.html).

    ``max_ids`` rows per user in the whole query, reservoir-sampled (``sample_max_ids``);
    ``censor_dims`` off because every grouping key here is public (no thresholding, no
    delta); ``clamp_counts`` off (dpsql does not clamp noisy counts either); values clamped
    into the bounds (``clamp_columns``), as dpsql clips them.
    """
    return {
        "Demo": {
            "": {
                "visits": {
                    "max_ids": max_ids,
                    "sample_max_ids": True,
                    "censor_dims": False,
                    "clamp_counts": False,
                    "clamp_columns": True,
                    "use_dpsu": False,
                    "row_privacy": False,
                    "user_id": {"type": "int", "private_id": True},
                    "region": {"type": "string"},
                    "device": {"type": "string"},
                    "age": {"type": "int", "lower": 0, "upper": 100},
                    "income": {"type": "float", "lower": 0.0, "upper": income_upper},
                }
            }
        }
    }


class Worker:
    def __init__(self) -> None:
        self.readers: dict[str, Any] = {}
        self.sql: dict[str, str] = {}

    def setup(self, req: dict[str, Any]) -> dict[str, Any]:
        import sqlite3  # noqa: PLC0415
        from importlib.metadata import version  # noqa: PLC0415

        import pandas as pd  # noqa: PLC0415
        import snsql  # noqa: PLC0415

        t0 = time.perf_counter()
        df = pd.read_parquet(req["parquet"])
        scale = float(req["income_scale"])
        df["income"] = df["income"] / scale  # see vs_smartnoise.py: SmartNoise's 1e7 scale guard
        read_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        if req["reader"] == "sqlite":  # one in-memory SQLite database, shared by every reader
            conn = sqlite3.connect(":memory:")
            df.to_sql("visits", conn, index=False)

            def open_reader(meta: dict[str, Any], privacy: Any) -> Any:
                return snsql.from_connection(conn, engine="sqlite", privacy=privacy, metadata=meta)
        else:  # from_df: SmartNoise copies the DataFrame into its own SQLite per reader
            def open_reader(meta: dict[str, Any], privacy: Any) -> Any:
                return snsql.from_df(df, privacy=privacy, metadata=meta)
        load_s = time.perf_counter() - t0
        epsilon = float(req["epsilon"])
        out: dict[str, Any] = {"queries": {}}
        for name, q in req["queries"].items():
            meta = metadata(int(q["max_ids"]), 250000.0 / scale)
            t0 = time.perf_counter()
            reader = open_reader(meta, snsql.Privacy(epsilon=1.0, delta=0.0))
            load_s += time.perf_counter() - t0
            # With epsilon 1 per mechanism the cost is the number of mechanisms k (basic
            # composition is the smaller bound at these k); then charge epsilon / k each.
            k = float(reader.get_privacy_cost(q["sql"])[0])
            reader.privacy = snsql.Privacy(epsilon=epsilon / k, delta=0.0)
            cost = [float(x) for x in reader.get_privacy_cost(q["sql"])]
            if abs(cost[0] - epsilon) > 1e-9 * epsilon:
                raise RuntimeError(f"{name}: SmartNoise charges {cost[0]}, not {epsilon}")
            subquery, _ = reader._rewrite(q["sql"])  # for the report only: what SQLite runs
            mechs = [
                {"epsilon": m.epsilon, "scale": m.scale, "sensitivity": m.sensitivity, "max_contrib": m.max_contrib}
                for m in reader._get_mechanisms(subquery)
                if m
            ]
            self.readers[name], self.sql[name] = reader, q["sql"]
            out["queries"][name] = {
                "mechanisms": len(mechs),
                "epsilon_per_mechanism": epsilon / k,
                "cost": cost,
                "mechanism_details": mechs,
                "engine_sql": str(subquery),
            }
        out.update(
            read_s=read_s,
            load_s=load_s,
            versions={
                "smartnoise-sql": version("smartnoise-sql"),
                "opendp": version("opendp"),
                "pandas": version("pandas"),
                "SQLAlchemy": version("SQLAlchemy"),
                "sqlite": sqlite3.sqlite_version,
                "python": sys.version.split()[0],
            },
        )
        return out

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        reader, sql = self.readers[req["name"]], self.sql[req["name"]]
        c0, w0 = time.process_time(), time.perf_counter()
        rows = reader.execute(sql)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        return {"wall": wall, "cpu": cpu, "rows": [list(r) for r in rows[1:]]}


def main() -> int:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # a library's print must not corrupt the protocol
    worker = Worker()
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        try:
            ans = worker.setup(req) if req["cmd"] == "setup" else worker.run(req)
            ans["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
            import traceback  # noqa: PLC0415

            ans = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        proto.write(json.dumps(ans, default=float) + "\n")
        proto.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
