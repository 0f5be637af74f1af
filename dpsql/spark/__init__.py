"""Apache Spark as a dpsql engine (needs pyspark and a Java runtime).

>>> from dpsql.spark import SparkEngine, local_session   # doctest: +SKIP
>>> engine = SparkEngine(local_session("local[2]"), tables={"visits": "data/visits/"}, owned=True)  # doctest: +SKIP
"""

from dpsql.spark.engine import SparkEngine, duckdb_type
from dpsql.spark.session import find_java, local_session

__all__ = ["SparkEngine", "duckdb_type", "find_java", "local_session"]
