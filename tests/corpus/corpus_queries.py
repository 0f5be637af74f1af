"""The corpus: analyst queries from peer DP-SQL systems' suites and docs, labelled.

Each :class:`Case` is one query over the schemas of :mod:`corpus_schema`, labelled
*answerable* (a differentially private answer exists under the corpus policy: every
released number is an aggregate over bounded contributions, every released key is public
or can pass partition selection) or *not answerable* (and why: ``why`` is a regular
expression a right refusal's message matches).

Sources (read-only peer material; the queries are short facts, rewritten here onto the
corpus schemas where the peer used its own tables; ``src`` names the file):

- ``sn:`` SmartNoise SQL, ``opendp/smartnoise-sdk`` ``sql/tests/**`` and ``sql/docs``
  (PUMS and Telemetry queries, kept as written, schema prefixes included);
- ``cw:`` the DuckDB ``privacy`` extension, ``cwida/privacy`` ``test/sql/*.test`` and
  ``benchmark/dp/tpch_queries`` (adapted to the TPC-H-shaped ``customer`` / ``orders`` /
  ``lineitem`` tables: its ``u``/``orders``/``order_items`` are ``customer``/``orders``/
  ``lineitem`` here);
- ``bq:`` written for this corpus in the style of Google's BigQuery / ZetaSQL differential
  privacy documentation examples (``professors``, ``visits``);
- ``ch:`` written for this corpus in the style of the workloads in Uber's Chorus /
  elastic sensitivity papers (``trips``, ``cities``);
- ``dp:`` written for this corpus to cover a category of issue 14 the peers touch only
  lightly.

``cat`` is the issue 14 category the query exercises (1-12), ``base`` for shapes dpsql
answered before issue 14, ``dialect`` / ``bqdp`` for the dialect and BigQuery-syntax items,
``out`` for output-side functions; not-answerable cases carry ``cat = "no"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    sql: str
    ok: bool
    cat: str
    src: str
    why: str = ""
    options: dict[str, object] = field(default_factory=dict)


CASES: list[Case] = []


def ok(sql: str, cat: str, src: str, **options: object) -> None:
    CASES.append(Case(" ".join(sql.split()), True, cat, src, options=dict(options)))


def no(sql: str, why: str, src: str, **options: object) -> None:
    CASES.append(Case(" ".join(sql.split()), False, "no", src, why, dict(options)))


RAW = r"raw|aggregate|GROUP BY"
UNIT = r"privacy unit"
DENIED = r"denied|not in the policy|deny"
STAR = r"SELECT \*|raw rows"

# ---------------------------------------------------------------------------------------
# SmartNoise SQL: sql/tests/query/queries/validate_pums/validate_pums.sql
S = "sn:sql/tests/query/queries/validate_pums/validate_pums.sql"
ok("SELECT SUM(age) FROM PUMS.PUMS", "12", S)
ok("SELECT COUNT(*), VAR(age) AS var_age FROM PUMS.PUMS", "5", S)
ok("SELECT married, educ, income, AVG(age) FROM PUMS.PUMS GROUP BY married, educ, income", "12", S)
ok("SELECT p.married, AVG(age) AS aa FROM PUMS.PUMS AS p GROUP BY married", "12", S)
ok("SELECT TOP 5 educ, AVG(income) FROM PUMS.PUMS GROUP BY educ", "12", S)
ok("SELECT COUNT(married), AVG(age) FROM PUMS.PUMS", "12", S)
ok("SELECT 3 AS three, p.married, educ, AVG(income) FROM PUMS.PUMS AS p GROUP BY educ, married", "12", S)
ok("SELECT educ FROM PUMS.PUMS GROUP BY educ", "3", S)
ok("SELECT SUM(age) AS age FROM PUMS.PUMS", "12", S)
ok("SELECT (SUM(age)) AS age FROM PUMS.PUMS", "12", S)
ok("SELECT SUM(age) * 1 AS age FROM PUMS.PUMS", "12", S)
ok("SELECT SUM(age), COUNT(*) FROM PUMS.PUMS", "12", S)
ok("SELECT PI(), RAND(), POWER(AVG(age), 2) FROM PUMS.PUMS", "out", S)
ok("SELECT SUM(age) FROM PUMS.PUMS GROUP BY married, CASE WHEN age > 90 THEN 1 ELSE 0 END", "12", S)
S = "sn:sql/tests/query/queries/validate_pums/validate_pums_fail.sql"
ok("SELECT SUM(Age + Income) FROM PUMS.PUMS", "6", S)  # answerable by interval arithmetic
no("SELECT SUM(SUM(age)) FROM PUMS.PUMS", r"nest|inside another aggregate|aggregate", S)
no("SELECT TOP 5 educ, AVG(income) FROM PUMS.PUMS GROUP BY income ORDER BY income DESC", RAW, S)
ok("SELECT COUNT(*) FROM (SELECT * FROM PUMS.PUMS)", "12", S)  # a row-level subquery
no("SELECT a.pid, b.income FROM PUMS.PUMS AS a JOIN PUMS.PUMS AS b ON b.pid = a.pid", RAW + "|" + UNIT, S)
no("SELECT married, educ, income, AVG(age) FROM PUMS.PUMS", RAW, S)
no("SELECT 3 AS three, p.married, educ, AVG(income) FROM PUMS.PUMS AS p GROUP BY educ", RAW, S)
no("SELECT CASE WHEN age > 90 THEN 1 ELSE 0 END AS age FROM PUMS.PUMS", RAW, S)
ok("SELECT SUM(CASE WHEN age > 90 THEN 1 ELSE 0 END) AS age FROM PUMS.PUMS", "6", S)
ok("SELECT SUM(age + 1) * 1 AS age FROM PUMS.PUMS", "6", S)

# SmartNoise SQL: queries in sql/tests/**/*.py and docs (PUMS)
S = "sn:sql/tests/**/*.py"
for q in [
    "SELECT ((SUM(age))) as age_total FROM PUMS.PUMS",
    "SELECT (SUM(age)) as age_total FROM PUMS.PUMS",
    "SELECT AVG(age) FROM PUMS.PUMS GROUP BY educ",
    "SELECT AVG(age) FROM PUMS.PUMS",
    "SELECT AVG(age) as age_total FROM PUMS.PUMS",
    "SELECT AVG(income) AS income FROM PUMS.PUMS GROUP BY married",
    "SELECT AVG(income) AS income FROM PUMS.PUMS",
    "SELECT COUNT (*) AS foo, COUNT(DISTINCT pid) AS bar FROM PUMS.PUMS",
    "SELECT COUNT(*) * 5 AS c, married AS m FROM PUMS.PUMS GROUP BY married ORDER BY c DESC",
    "SELECT COUNT(*) AS c FROM PUMS.PUMS GROUP BY married",
    "SELECT COUNT(*) AS c FROM PUMS.PUMS WHERE age > 70 GROUP BY educ",
    "SELECT COUNT(*) AS c FROM PUMS.PUMS",
    "SELECT COUNT(*) AS c, married AS m FROM PUMS.PUMS GROUP BY married ORDER BY c DESC",
    "SELECT COUNT(*) AS count_all, SUM(income) AS sum_income, AVG(income) AS avg_income, VARIANCE(income) AS var_income, STDDEV(income) AS stddev_income FROM PUMS.PUMS",
    "SELECT COUNT(*) FROM PUMS.PUMS GROUP BY educ",
    "SELECT COUNT(*) as c FROM PUMS.PUMS WHERE age > 100",
    "SELECT COUNT(DISTINCT pid) AS pid FROM PUMS.PUMS GROUP BY married",
    "SELECT COUNT(DISTINCT pid) FROM PUMS.PUMS GROUP BY educ",
    "SELECT COUNT(age) FROM PUMS.PUMS GROUP BY sex",
    "SELECT COUNT(income) FROM PUMS.PUMS",
    "SELECT SUM(age) AS my_sum FROM PUMS.PUMS GROUP BY age",
    "SELECT SUM(age) AS my_sum FROM pums.pums GROUP BY age",
    "SELECT SUM(income) FROM PUMS.PUMS",
    "SELECT educ, SUM(income) AS total_income, AVG(income) AS avg_income, AVG(age) FROM PUMS.PUMS WHERE married = '1' GROUP BY educ",
    "SELECT COUNT(*) AS c, COUNT(sex) AS s, COUNT(age) AS a FROM PUMS.PUMS",
    "SELECT AVG(age), SUM(age), COUNT(age) FROM PUMS.PUMS",
    "SELECT sex, COUNT(*) AS n, AVG(age) AS age FROM PUMS.PUMS GROUP BY sex ORDER BY sex",
    "SELECT educ, COUNT(*) AS n FROM PUMS.PUMS GROUP BY educ LIMIT 4",
    "SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married ORDER BY married, age DESC LIMIT 10",
    "SELECT age, COUNT(*) AS n FROM PUMS.PUMS GROUP BY age HAVING (age < 30 OR age > 60) AND n > 10",
    "SELECT age, COUNT(*) FROM PUMS.PUMS GROUP BY age HAVING age < 30 OR age > 60",
    "SELECT age, SUM(income) AS sum_income FROM PUMS.PUMS GROUP BY age HAVING age > 5 AND COUNT(*) > 7 OR NOT ( age < 5)",
    "SELECT age as age, COUNT(*) FROM PUMS.PUMS GROUP BY age HAVING age * 1000 < 30000 OR age * 2 > 120",
    "SELECT age * 1000 as age, COUNT(*) FROM PUMS.PUMS GROUP BY age HAVING age < 30000 OR age > 60000",
    "SELECT age, COUNT(*) * 1000 AS n FROM PUMS.PUMS GROUP BY age HAVING (age < 30 OR age > 60) AND n > 10000",
    "SELECT COUNT(*) AS c FROM PUMS.PUMS WHERE age > 90 AND educ = '8'",
    "SELECT COUNT(*) AS c FROM PUMS.PUMS WHERE age > 80 GROUP BY educ",
    "SELECT SUM(age) as c FROM PUMS.PUMS WHERE age > 100",
    "SELECT AVG(age) AS my_sum FROM PUMS.PUMS GROUP BY age",
    "SELECT sex, AVG(age) AS age FROM PUMS.PUMS GROUP BY sex",
    "SELECT TOP 2 educ, AVG(age) AS age FROM PUMS.PUMS GROUP BY educ ORDER BY age DESC",
    "SELECT TOP 5 educ, COUNT(*) AS n FROM PUMS.PUMS GROUP BY educ ORDER BY n DESC",
    "SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married ORDER BY income DESC LIMIT 50",
    "SELECT age, sex, SUM(income) AS sum_income FROM PUMS.PUMS GROUP BY age, sex ORDER BY age, sum_income, sex DESC LIMIT 10",
    "SELECT sex, COUNT(*) AS n, COUNT(*) AS foo FROM PUMS.PUMS GROUP BY sex ORDER BY sex",
    "SELECT COUNT(*) FROM PUMS.PUMS.PUMS",
    "SELECT COUNT(*) FROM pums",
    "SELECT educ, AVG(age) AS age FROM PUMS.PUMS GROUP BY educ",
    "SELECT AVG(age), AVG(income) FROM PUMS.PUMS",
]:
    ok(q, "12", S)
for q in [
    "SELECT (VAR(age)) AS my_var, married FROM PUMS.PUMS GROUP BY married",
    "SELECT STD(age) FROM PUMS.PUMS GROUP BY sex",
    "SELECT STDDEV(age) as age_total FROM PUMS.PUMS",
    "SELECT VAR(age) FROM PUMS.PUMS GROUP BY educ",
    "SELECT VAR(age), VAR(income) FROM PUMS.PUMS GROUP BY sex",
    "SELECT VARIANCE(age) as age_total FROM PUMS.PUMS",
    "SELECT AVG(age) + 3, STD(age), VAR(age), SUM(age) / 10, COUNT(age) + 2 FROM PUMS.PUMS",
]:
    ok(q, "5", S)
ok("SELECT POWER(SUM(age), 2) as age_total FROM PUMS.PUMS", "out", S)
ok("SELECT COUNT(DISTINCT age) FROM PUMS.PUMS GROUP BY educ", "9", S)
ok("SELECT COUNT(DISTINCT pid) AS n, age, income FROM PUMS.PUMS WHERE age > 55 GROUP BY age, income", "12", S)
ok("SELECT income FROM PUMS.PUMS GROUP BY income", "3", S)
ok("SELECT income, COUNT(pid) AS n FROM PUMS.PUMS GROUP BY income", "12", S)
ok("SELECT income, SUM(income) FROM PUMS.PUMS GROUP BY income", "12", S)
ok("SELECT married, SUM(income) AS my_sum, SUM(age) AS sum_age FROM PUMS.PUMS GROUP BY married HAVING married = '1'", "12", S)
ok("SELECT COUNT(*) AS c FROM PUMS.PUMS WHERE age > 70 AND educ < 2", "7", S)
ok("SELECT educ, SUM(income) AS income FROM PUMS.PUMS WHERE educ IN (2, 3) GROUP BY educ ORDER BY educ DESC", "7", S)
ok("SELECT SUM(income) AS income FROM PUMS.PUMS WHERE sex = True", "7", S)
ok("SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married HAVING married = 1", "2", S)
ok("SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married HAVING married = 0", "2", S)
ok("SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married HAVING n > 10 OR married = 1", "2", S)
ok("SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married HAVING n > 10 OR married = 0", "2", S)
ok("SELECT age, sex, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, sex HAVING income > 100000 OR sex = 1", "2", S)
ok("SELECT age, sex, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, sex HAVING income > 100000", "10", S)
ok("SELECT age, sex, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, sex HAVING sex = 1", "2", S)
ok("SELECT age, sex, SUM(income) AS my_sum, SUM(age) AS sum_age FROM PUMS.PUMS GROUP BY age, sex HAVING NOT ( sex = True ) ORDER BY my_sum, sex DESC LIMIT 10", "2", S)
ok("SELECT educ FROM pums GROUP BY educ ORDER by CAST(educ AS INTEGER) DESC", "2", S)
ok("SELECT educ FROM pums GROUP BY educ ORDER by CAST(educ AS VARCHAR) DESC", "2", S)
no("SELECT educ FROM pums GROUP BY educ ORDER by sex DESC", RAW, S)
ok("SELECT educ as sex, sex as educ, COUNT(*) AS n FROM pums GROUP BY sex, educ HAVING educ > 2", "2", S)
ok("SELECT sex as educ, educ as sex, COUNT(*) AS n FROM pums GROUP BY sex, educ HAVING sex > 2", "2", S)
ok("SELECT educ, COUNT(*) FROM pums GROUP BY educ HAVING (COUNT(*) / CAST(educ AS INTEGER)) > 5", "2", S)
ok("SELECT educ, COUNT(*) FROM pums GROUP BY educ HAVING COUNT(*) > 50", "base", S)
ok("SELECT educ, COUNT(DISTINCT pid) AS n FROM pums GROUP BY educ HAVING COUNT(*) > 50", "base", S)
ok("SELECT educ, COUNT(DISTINCT pid) AS n FROM pums GROUP BY educ HAVING COUNT(DISTINCT pid) > 50", "base", S)
ok("SELECT educ, COUNT(DISTINCT pid) AS n FROM pums GROUP BY educ HAVING n > 50", "base", S)
ok("SELECT educ, COUNT(DISTINCT pid) AS n FROM pums GROUP BY educ ORDER by COUNT(pid) DESC", "base", S)
ok("SELECT sex AS gender, educ AS sex FROM pums GROUP BY sex, educ ORDER by (CAST(gender AS INTEGER) * -1) DESC", "2", S)
ok("SELECT sex AS gender, educ AS sex FROM pums GROUP BY sex, educ ORDER by gender DESC", "3", S)
ok("SELECT sex AS gender, educ AS sex FROM pums GROUP BY sex, educ ORDER by sex DESC", "3", S)
ok("SELECT sex AS gender, educ FROM pums GROUP BY sex, educ ORDER by sex DESC", "3", S)
ok("SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married HAVING NOT married", "2", S)
ok("SELECT age, married, COUNT(*) AS n, SUM(income) AS income FROM PUMS.PUMS GROUP BY age, married HAVING married", "2", S)
no("SELECT age as a FROM PUMS.PUMS WHERE age > 100", RAW, S)
no("SELECT * FROM PUMS.PUMS", STAR, S)
no("SELECT COUNT(*) FROM PUMS.PUMS UNION ALL SELECT COUNT(*) FROM PUMS.PUMS", r"UNION", S)
no("SELECT pid, COUNT(*) FROM PUMS.PUMS GROUP BY pid", UNIT, S)
no("SELECT SUM(pid) FROM PUMS.PUMS", UNIT, S)
no("SELECT AVG(age) FROM PUMS.PUMS WHERE age > (SELECT AVG(age) FROM PUMS.PUMS)", r"subquer", S)

# SmartNoise SQL: Telemetry (sql/tests/query/queries/run/run.sql, rewrite/rewrites.sql,
# compare/compare.sql, test_query.py)
S = "sn:sql/tests/query/queries/run/run.sql"
for q in [
    "SELECT SUM(Crashes) AS crashes FROM Telemetry.Crashes WHERE Region = 'LATAM'",
    "SELECT AVG(Temperature) AS temperature FROM Telemetry.Crashes GROUP BY Refurbished",
    "SELECT Building, SUM(Crashes) AS total_crash, AVG(Crashes) AS avg_crashes, AVG(Temperature) FROM Telemetry.Crashes WHERE Refurbished = TRUE GROUP BY Building",
    "SELECT COUNT(DeviceID) AS Devices FROM Telemetry.Crashes",
    "SELECT SUM(Crashes) AS Crashes, COUNT(DeviceID) AS Devices FROM Telemetry.Crashes",
    "SELECT SUM(Crashes) AS Crashes FROM Telemetry.Crashes",
    "SELECT COUNT(Crashes) AS Crashes FROM Telemetry.Crashes",
    "SELECT Region, SUM(Crashes) AS crashes FROM Telemetry.Crashes WHERE Region IN ('LATAM', 'EMEA') GROUP BY Region ORDER BY Region DESC",
    "SELECT COUNT(DeviceID) AS n, Region, Building, Refurbished FROM Telemetry.Crashes WHERE Temperature > 55 GROUP BY Region, Building, Refurbished",
    "SELECT COUNT(DISTINCT DeviceID) AS n, Region, Building, Refurbished FROM Telemetry.Crashes WHERE Temperature > 55 GROUP BY Region, Building, Refurbished",
    "SELECT COUNT(DISTINCT DeviceID) AS did FROM Telemetry.Crashes GROUP BY Refurbished",
    "SELECT COUNT(DISTINCT DeviceID) AS did FROM Telemetry.Crashes",
    "SELECT Region, Refurbished, AVG(Temperature) FROM Telemetry.Crashes GROUP BY Region, Refurbished ORDER BY Refurbished, Region",
    "SELECT Region, Refurbished, AVG(Temperature) FROM Telemetry.Crashes GROUP BY Region, Refurbished ORDER BY Region, Refurbished DESC",
]:
    ok(q, "12", S)
ok("SELECT SQRT(AVG(Crashes * Crashes) - AVG(Crashes) * AVG(Crashes)) FROM Telemetry.Crashes", "6", S)
S = "sn:sql/tests/query/queries/rewrite/rewrites.sql"
for q in [
    "SELECT SUM(Temperature), SUM(Temperature), SUM(Crashes), COUNT(Building) FROM Telemetry.Crashes GROUP BY Region",
    "SELECT AVG(Temperature) AS avg_temperature, Region, Building, Refurbished FROM Telemetry.Crashes WHERE Temperature > 53.1 GROUP BY Refurbished, Region, Building",
    "SELECT COUNT(DeviceID) AS Devices, Region, Refurbished, Building, AVG(Temperature) AS Temperature FROM Telemetry.Crashes WHERE Temperature > 53.1 GROUP BY Region, Refurbished, Building ORDER BY Region, Refurbished, Building DESC",
    "SELECT COUNT(DeviceID) AS Devices, Region, Refurbished, AVG(Temperature) AS Temperature FROM Telemetry.Crashes GROUP BY Region, Refurbished ORDER BY Region, Refurbished DESC",
]:
    ok(q, "12", S)
S = "sn:sql/tests/query/queries/compare/compare.sql"
ok("SELECT OEM, AVG(Temperature) FROM Telemetry.Census JOIN Telemetry.Crashes USING(DeviceID) GROUP BY OEM ORDER BY OEM", "11", S)
ok("SELECT SUM(Crashes), TrialGroup FROM Telemetry.Census JOIN Telemetry.Crashes USING(DeviceID) JOIN Telemetry.Rollouts USING(DeviceID) GROUP BY TrialGroup ORDER BY TrialGroup", "11", S)
ok("""SELECT OEM, TrialGroup, COUNT(DeviceID) AS N, SUM(Crashes) FROM (
       SELECT Crashes, T.* FROM Telemetry.Crashes JOIN (
        SELECT DeviceID, OEM, TrialGroup FROM (Telemetry.Census JOIN Telemetry.Rollouts USING(DeviceID)) AS Q
       ) AS T USING(DeviceID)) AS Z GROUP BY OEM, TrialGroup ORDER BY OEM, TrialGroup""", "1", S)
S = "sn:sql/tests/query/test_query.py"
ok("SELECT SUM(C.Crashes) AS Crashes FROM (Telemetry.Crashes) AS C", "11", S)
ok("SELECT (3 * COUNT(Temperature)) AS Temperature FROM (SELECT * FROM (SELECT * FROM (SELECT Temperature, Crashes FROM Telemetry.Census JOIN Telemetry.Crashes USING(DeviceID))))", "1", S)
ok("SELECT COUNT(Temperature) / 7 AS Temperature FROM (SELECT * FROM (SELECT * FROM (SELECT Temperature, Crashes FROM Telemetry.Census JOIN Telemetry.Crashes USING(DeviceID))))", "1", S)
no("SELECT Temperature FROM (SELECT * FROM (SELECT * FROM (SELECT Temperature, Crashes FROM Telemetry.Census JOIN Telemetry.Crashes USING(DeviceID))))", RAW, S)
no("SELECT (1 + Temperature) AS Temperature FROM (SELECT * FROM (SELECT Temperature, Crashes FROM Telemetry.Census JOIN Telemetry.Crashes USING(DeviceID)))", RAW, S)
no("SELECT OEM, Crashes FROM (Telemetry.Rollouts INNER JOIN Telemetry.Census INNER JOIN Telemetry.Crashes USING(DeviceID))", RAW + "|JOIN", S)
no("SELECT * FROM Telemetry.Crashes", STAR, S)
no("SELECT Refurbished FROM Telemetry.Crashes", RAW, S)
no("SELECT 7 * Temperature, Crashes * 101.11 FROM Telemetry.Crashes", RAW, S)
S = "sn:sql/tests/query/queries/parse/subqueries.sql"
ok("""SELECT Region, SUM(sum_Crashes) AS crashes FROM (SELECT DeviceID, Region, SUM(Crashes) AS sum_Crashes
      FROM Telemetry.Crashes WHERE Region IN ('LATAM', 'EMEA') GROUP BY DeviceID, Region) AS per_key
      GROUP BY Region ORDER BY Region DESC""", "1", S)
S = "sn:sql/tests/query/queries/parse/order.sql"
ok("SELECT COUNT(*) AS N, SUM(Crashes) AS S FROM Telemetry.Crashes ORDER BY 2 * S / ((N + 300.11) / 2) DESC", "base", S)
ok("SELECT COUNT(DISTINCT DeviceID) AS N FROM (SELECT DeviceID, SUM(Crashes) AS S FROM Telemetry.Crashes GROUP BY DeviceID) AS t", "1", S)
S = "sn:sql/tests/query/queries/parse/groupby.sql"
no("SELECT Region, SUM(DISTINCT Crashes) FROM Telemetry.Crashes GROUP BY Region", r"DISTINCT", S)
S = "sn:sql/tests/query/queries/parse/expressions.sql"
no("SELECT CASE WHEN Crashes < 3 THEN 1 WHEN Crashes < 6 THEN 2 ELSE 3 END AS bucket FROM Telemetry.Crashes", RAW, S)
no("SELECT ROUND(Temperature, 1) AS t FROM Telemetry.Crashes", RAW, S)
no("SELECT random() AS r FROM Telemetry.Crashes ORDER BY r", RAW + r"|RANDOM|not supported", S)
ok("SELECT LN(COUNT(*)) FROM Telemetry.Crashes", "out", S)
ok("SELECT CEIL(COUNT(*)) FROM Telemetry.Crashes", "out", S)
ok("SELECT LOG2(COUNT(*)) FROM Telemetry.Crashes", "out", S)
ok("SELECT STDEV(Temperature) FROM Telemetry.Crashes", "5", S)
S = "sn:sql/docs/source/metadata.rst"
ok("SELECT SUM(income) FROM pums.pums", "12", S)
ok("SELECT SUM(income) FROM Finance.PUMS.PUMS", "12", S)
ok('SELECT SUM("income") FROM PUMS."PUMS"', "12", S)
ok("SELECT SUM([income]) FROM PUMS.[PUMS]", "dialect", S, dialect="tsql")
S = "sn:sql/tests/private_reader/test_pre_aggregated.py"
ok("SELECT AVG(n) FROM (SELECT pid, COUNT(*) AS n FROM PUMS.PUMS GROUP BY pid) AS s", "1", S)
ok("SELECT SUM(total) FROM (SELECT pid, SUM(income) AS total FROM pums GROUP BY pid) AS per_person", "1", S)
# SmartNoise: row-privacy PUMS (datasets/PUMS.yaml: row_privacy = True)
S = "sn:datasets/PUMS.yaml (row_privacy)"
for q in [
    "SELECT COUNT(*) FROM pums_rows",
    "SELECT sex, AVG(income) FROM pums_rows GROUP BY sex",
    "SELECT married, COUNT(*) AS n FROM pums_rows GROUP BY married ORDER BY n DESC",
    "SELECT educ, AVG(age) FROM pums_rows GROUP BY educ",
]:
    ok(q, "base", S)
ok("SELECT VAR(age) FROM pums_rows", "5", S)
ok("SELECT MAX(age), MIN(age) FROM pums_rows", "9", S)

# ---------------------------------------------------------------------------------------
# DuckDB privacy extension (cwida/privacy), test/sql/dp_elastic.test and dp_standard.test,
# onto customer (its ``u``) and orders (its ``orders(uid, amount)``).
S = "cw:test/sql/dp_elastic.test"
ok("SELECT COUNT(*) FROM customer", "base", S)
ok("SELECT COUNT(*) FROM customer JOIN orders ON customer.c_custkey = orders.o_custkey", "base", S)
ok("SELECT SUM(o_totalprice) FROM customer JOIN orders ON customer.c_custkey = orders.o_custkey", "base", S)
ok("SELECT AVG(o_totalprice) FROM customer JOIN orders ON customer.c_custkey = orders.o_custkey", "base", S)
ok("SELECT COUNT(*), SUM(c_acctbal), AVG(c_acctbal) FROM customer", "base", S)
ok("SELECT COUNT(*) FROM orders WHERE o_totalprice > 3000", "base", S)
ok("SELECT COUNT(*) FROM customer JOIN orders ON customer.c_custkey = orders.o_custkey WHERE o_totalprice > 3000", "base", S)
ok("SELECT CAST(o_totalprice / 100000 AS INTEGER) AS g, COUNT(*) FROM orders WHERE o_totalprice > 2000 GROUP BY g ORDER BY g", "7", S)
ok("SELECT CAST(o_totalprice / 100000 AS INTEGER) g, AVG(o_totalprice) FROM orders GROUP BY g HAVING AVG(o_totalprice) > 3 ORDER BY g", "7", S)
ok("SELECT CAST(o_totalprice / 100000 AS INTEGER), COUNT(*) FROM orders GROUP BY CAST(o_totalprice / 100000 AS INTEGER)", "7", S)
ok("SELECT AVG(o_totalprice) FILTER (WHERE o_totalprice > 2000) FROM orders", "6", S)
ok("SELECT AVG(o_totalprice), AVG(o_totalprice) FILTER (WHERE o_totalprice > 2000) FROM orders", "6", S)
ok("SELECT abs(COUNT(*) - 100) < 50 FROM customer", "out", S)
ok("SELECT MIN(c_acctbal) FROM customer", "9", S)
ok("SELECT SUM(l_extendedprice) FROM customer JOIN orders ON customer.c_custkey = orders.o_custkey JOIN lineitem ON orders.o_orderkey = lineitem.l_orderkey", "4", S)
ok("SELECT COUNT(*) FROM lineitem", "4", S)
ok("SELECT SUM(l_extendedprice) FROM lineitem", "4", S)
ok("SELECT AVG(l_extendedprice) FROM lineitem", "4", S)
ok("SELECT COUNT(*) FROM lineitem a JOIN lineitem b ON a.l_orderkey = b.l_orderkey", "11", S)  # one order, one unit
no("SELECT typeof(COUNT(*)) FROM customer", r"TYPEOF|not supported", S)
S = "cw:test/sql/dp_standard.test"
ok("SELECT SUM(o_totalprice), SUM(o_totalprice * 1000.0) FROM orders", "6", S)
ok("SELECT SUM(o_totalprice)::BIGINT, SUM(o_totalprice * 1000.0)::BIGINT FROM orders", "6", S)
ok("SELECT SUM(o_totalprice) FILTER (WHERE o_totalprice > 5000) FROM orders", "6", S)
ok("SELECT COUNT(*) FILTER (WHERE o_totalprice > 5000) FROM orders", "6", S)
ok("SELECT SUM(o_totalprice)::BIGINT, (AVG(o_totalprice) * 10)::BIGINT FROM orders", "out", S)
ok("SELECT o_orderstatus, COUNT(*) FROM orders GROUP BY o_orderstatus", "base", S)
ok("SELECT nation.n_name, COUNT(DISTINCT customer.c_custkey) FROM customer JOIN nation ON customer.c_nationkey = nation.n_nationkey GROUP BY nation.n_name", "base", S)
ok("SELECT MIN(c_acctbal), MAX(c_acctbal) FROM customer", "9", S)
ok("SELECT MIN(o_totalprice), MAX(o_totalprice) FROM orders JOIN customer ON orders.o_custkey = customer.c_custkey", "9", S)
ok("SELECT o_orderstatus, MIN(o_totalprice), MAX(o_totalprice) FROM orders JOIN customer ON orders.o_custkey = customer.c_custkey GROUP BY o_orderstatus ORDER BY o_orderstatus", "9", S)
ok("SELECT COUNT(*) FROM orders o1 WHERE EXISTS (SELECT * FROM orders o2 WHERE o2.o_custkey = o1.o_custkey AND o2.o_orderstatus <> o1.o_orderstatus)", "11", S)
S = "cw:test/sql/privacy_compatible.test"
ok("SELECT c_mktsegment, SUM(c_acctbal) FROM customer GROUP BY c_mktsegment ORDER BY c_mktsegment", "base", S)
no("SELECT c_mktsegment FROM customer", RAW, S)
no("SELECT c_mktsegment, SUM(c_acctbal) OVER (PARTITION BY c_mktsegment) FROM customer", r"window", S)
ok("SELECT SUM(c_acctbal) FROM customer WHERE c_nationkey > 1", "base", S)
ok("SELECT SUM(c_nationkey * 2) FROM customer", "6", S)
ok("SELECT SUM(CASE WHEN c_nationkey > 1 THEN c_acctbal ELSE 0 END) FROM customer", "6", S)
no("SELECT SUM(c_acctbal) FROM customer WHERE c_acctbal > (SELECT AVG(c_acctbal) FROM customer)", r"subquer", S)
no("SELECT SUM(window_sum) FROM (SELECT c_mktsegment, SUM(c_acctbal) OVER (PARTITION BY c_mktsegment) AS window_sum FROM customer) AS w", r"window", S)
ok("SELECT part.p_type, SUM(lineitem.l_extendedprice) FROM lineitem JOIN part ON lineitem.l_partkey = part.p_partkey GROUP BY part.p_type ORDER BY part.p_type", "4", S)
ok("SELECT o_orderpriority, SUM(o_totalprice) FROM orders GROUP BY o_orderpriority ORDER BY o_orderpriority", "base", S)
ok("SELECT DISTINCT o_orderstatus FROM orders", "3", S)
ok("SELECT DISTINCT o_orderstatus, SUM(o_totalprice) FROM orders GROUP BY o_orderstatus", "3", S)
ok("SELECT SUM(total) FROM (SELECT o_custkey, SUM(o_totalprice) AS total FROM orders GROUP BY o_custkey) AS sub", "1", S)
no("SELECT c_name FROM customer", DENIED, S)
no("SELECT COUNT(DISTINCT c_name) FROM customer", DENIED, S)
no("SELECT SUM(c_custkey) FROM customer", UNIT, S)
S = "cw:test/sql/privacy_links.test"
ok("SELECT o_orderstatus, COUNT(*) FROM orders GROUP BY o_orderstatus ORDER BY o_orderstatus", "base", S)
ok("SELECT l_returnflag, MIN(l_quantity), MAX(l_quantity) FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag LIMIT 1", "9", S)
ok("SELECT o.o_orderstatus, SUM(l.l_quantity) FROM orders o INNER JOIN lineitem l ON l.l_orderkey = o.o_orderkey GROUP BY o.o_orderstatus ORDER BY o.o_orderstatus", "4", S)
ok("SELECT l_returnflag, SUM(l_quantity) FROM lineitem WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_totalprice > 10000) GROUP BY l_returnflag", "11", S)
ok("SELECT o.o_orderstatus, COUNT(*) FROM orders o INNER JOIN customer c ON o.o_custkey = c.c_custkey WHERE c.c_nationkey > 0 GROUP BY o.o_orderstatus ORDER BY o.o_orderstatus", "base", S)
ok("""SELECT o_orderstatus, SUM(total_items) AS grand_total FROM (
        SELECT o.o_orderstatus, o.o_custkey, COUNT(*) AS total_items FROM orders o INNER JOIN lineitem l ON l.l_orderkey = o.o_orderkey
        WHERE l.l_quantity > 10 GROUP BY o.o_orderstatus, o.o_custkey) subq GROUP BY o_orderstatus ORDER BY o_orderstatus""", "1", S)
ok("SELECT o.o_orderstatus, COUNT(*) AS cnt, SUM(o.o_totalprice) AS total FROM orders o GROUP BY o.o_orderstatus HAVING SUM(o.o_totalprice) > 1 ORDER BY o.o_orderstatus LIMIT 1", "base", S)
ok("SELECT l.l_returnflag, COUNT(DISTINCT l.l_orderkey) AS unique_orders FROM lineitem l GROUP BY l.l_returnflag", "9", S)
ok("SELECT o_orderstatus, COUNT(DISTINCT o_totalprice), SUM(o_totalprice) FROM orders GROUP BY o_orderstatus ORDER BY o_orderstatus", "9", S)
ok("SELECT o_orderstatus, COUNT(DISTINCT o_totalprice), COUNT(DISTINCT o_custkey) FROM orders GROUP BY o_orderstatus ORDER BY o_orderstatus", "9", S)
no("SELECT c.c_custkey, COUNT(*) FROM customer c INNER JOIN orders o ON o.o_custkey = c.c_custkey GROUP BY c.c_custkey", UNIT, S)
no("SELECT SUM(l.l_quantity) FROM lineitem l INNER JOIN orders o ON l.l_orderkey = o.o_orderkey UNION ALL SELECT SUM(o.o_totalprice) FROM orders o", r"UNION", S)
no("SELECT o.o_orderstatus, SUM(o.o_totalprice) AS total, (SELECT SUM(l.l_quantity) FROM lineitem l WHERE l.l_orderkey = o.o_orderkey) AS item_sum FROM orders o GROUP BY o.o_orderstatus", r"subquer", S)
S = "cw:test/sql/pac_cte.test"
ok("WITH cust AS (SELECT c_custkey, c_mktsegment, c_nationkey FROM customer) SELECT COUNT(*) FROM cust", "base", S)
ok("WITH cust_base AS (SELECT c_custkey, c_nationkey FROM customer), cust_nation AS (SELECT c_custkey, n_name FROM cust_base JOIN nation ON c_nationkey = n_nationkey) SELECT COUNT(*) FROM cust_nation", "1", S)
ok("WITH customer_orders AS (SELECT c_custkey, o_orderkey, o_orderdate FROM customer JOIN orders ON c_custkey = o_custkey) SELECT COUNT(*) FROM customer_orders", "1", S)
ok("WITH data AS (SELECT o_orderstatus, o_totalprice FROM orders) SELECT o_orderstatus, SUM(o_totalprice) AS total FROM data GROUP BY o_orderstatus ORDER BY o_orderstatus", "base", S)
ok("WITH order_amounts AS (SELECT o_custkey, l_extendedprice, l_discount FROM lineitem JOIN orders ON l_orderkey = o_orderkey) SELECT SUM(l_extendedprice * (1 - l_discount)) FROM order_amounts", "1", S)
ok("WITH c_orders AS (SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%urgent%' GROUP BY c_custkey) SELECT c_count, COUNT(*) AS custdist FROM c_orders GROUP BY c_count ORDER BY custdist DESC, c_count DESC", "1", S)
no("WITH cust_orders AS (SELECT c_custkey, COUNT(o_orderkey) AS order_count FROM customer LEFT JOIN orders ON c_custkey = o_custkey GROUP BY c_custkey) SELECT COUNT(*) FROM cust_orders WHERE order_count > (SELECT AVG(order_count) FROM cust_orders)", r"subquer", S)
S = "cw:benchmark/dp/tpch_queries"
ok("""SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
      sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price, sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
      avg(l_quantity) AS avg_qty, avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc, count(*) AS count_order
      FROM lineitem WHERE l_shipdate <= CAST('1998-09-02' AS date) GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""", "4", S + "/q01.sql")
ok("""SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem WHERE l_shipdate >= CAST('1994-01-01' AS date)
      AND l_shipdate < CAST('1995-01-01' AS date) AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""", "4", S + "/q06.sql")
ok("""SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
      / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue FROM lineitem, part WHERE l_partkey = p_partkey
      AND l_shipdate >= CAST('1995-09-01' AS date) AND l_shipdate < CAST('1995-10-01' AS date)""", "4", S + "/q14.sql")
ok("""SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue FROM customer, orders, lineitem, supplier, nation, region
      WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey AND c_nationkey = s_nationkey
      AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'ASIA' AND o_orderdate >= CAST('1994-01-01' AS date)
      AND o_orderdate < CAST('1995-01-01' AS date) GROUP BY n_name ORDER BY revenue DESC""", "4", S + "/q05.sql")
ok("""SELECT sum(l_extendedprice * (1 - l_discount)) AS revenue FROM lineitem, part WHERE p_partkey = l_partkey
      AND l_shipmode IN ('AIR', 'MAIL') AND ((p_brand = 'Brand#12' AND l_quantity >= 1 AND l_quantity <= 11 AND p_size BETWEEN 1 AND 5)
      OR (p_brand = 'Brand#23' AND l_quantity >= 10 AND l_quantity <= 20 AND p_size BETWEEN 1 AND 10))""", "4", S + "/q19.sql")
ok("""SELECT o_orderpriority, count(*) AS order_count FROM orders WHERE o_orderdate >= DATE '1993-07-01'
      AND o_orderdate < DATE '1993-10-01' AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND l_commitdate < l_receiptdate)
      GROUP BY o_orderpriority ORDER BY o_orderpriority""", "11", "cw:benchmark/tpch/tpch_as_queries/q04.sql")
ok("""SELECT l_shipmode, sum(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high_line_count,
      sum(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END) AS low_line_count
      FROM orders, lineitem WHERE o_orderkey = l_orderkey AND l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate
      AND l_shipdate < l_commitdate AND l_receiptdate >= DATE '1994-01-01' AND l_receiptdate < DATE '1994-01-01' + INTERVAL '1' YEAR
      GROUP BY l_shipmode ORDER BY l_shipmode""", "4", "cw:benchmark/tpch/tpch_as_queries/q12.sql")
ok("""SELECT c_count, count(*) AS custdist FROM (SELECT c_custkey, count(o_orderkey) AS c_count FROM customer LEFT OUTER JOIN orders
      ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%' GROUP BY c_custkey) AS c_orders (c_custkey, c_count)
      GROUP BY c_count ORDER BY custdist DESC, c_count DESC""", "1", "cw:benchmark/tpch/tpch_as_queries/q13.sql")
ok("""SELECT extract(year FROM o_orderdate) AS o_year, sum(l_extendedprice * (1 - l_discount)) AS volume FROM orders, lineitem
      WHERE o_orderkey = l_orderkey AND o_orderdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31' GROUP BY o_year ORDER BY o_year""",
   "7", "cw:benchmark/tpch/tpch_as_queries/q08.sql (simplified)")
no("""SELECT l_suppkey, sum(l_extendedprice * (1 - l_discount)) AS total_revenue FROM lineitem GROUP BY l_suppkey
      HAVING sum(l_extendedprice) = (SELECT max(total) FROM (SELECT sum(l_extendedprice) AS total FROM lineitem GROUP BY l_suppkey) t)""",
   r"subquer", "cw:benchmark/tpch/tpch_as_queries/q15.sql")
no("SELECT c_custkey, sum(o_totalprice) FROM customer, orders WHERE c_custkey = o_custkey GROUP BY c_custkey ORDER BY 2 DESC LIMIT 100",
   UNIT, "cw:benchmark/tpch/tpch_as_queries/q18.sql (shape)")

# ---------------------------------------------------------------------------------------
# BigQuery / ZetaSQL differential privacy documentation style (written for this corpus).
S = "bq:style of the BigQuery DP docs (professors example)"
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=10, delta=.01, max_groups_contributed=1, privacy_unit_column=id)
      item, AVG(quantity, contribution_bounds_per_group => (0,100)) AS average_quantity FROM professors GROUP BY item""", "bqdp", S)
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5, privacy_unit_column=id)
      item, COUNT(*) AS times_requested FROM professors GROUP BY item""", "bqdp", S)
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5)
      item, SUM(quantity) AS quantity FROM professors GROUP BY item""", "bqdp", S)
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5, privacy_unit_column=id)
      COUNT(DISTINCT id) AS professors FROM professors""", "bqdp", S)
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5)
      item, SUM(quantity, contribution_bounds_per_group => (0, 50)) AS q FROM professors GROUP BY item""", "bqdp", S)
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5)
      item, PERCENTILE_CONT(quantity, 0.5, contribution_bounds_per_row => (0,100)) AS median_quantity FROM professors GROUP BY item""", "bqdp", S)
ok("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5, max_groups_contributed=2)
      item, VAR_POP(quantity, contribution_bounds_per_row => (0,100)) AS v FROM professors GROUP BY item""", "bqdp", S)
no("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5, privacy_unit_column=item)
      COUNT(*) FROM professors""", r"privacy_unit_column|privacy unit", S)
no("""SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5)
      item, SUM(quantity, contribution_bounds_per_group => (0, 5000)) AS q FROM professors GROUP BY item""", r"widen|bounds|narrow", S)
ok("SELECT item, AVG(quantity) AS average_quantity FROM professors GROUP BY item", "base", S)
ok("SELECT item, COUNT(*) AS n FROM professors GROUP BY item ORDER BY n DESC", "base", S)
S = "bq:style of the ZetaSQL DP examples (visits)"
for q in [
    "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income FROM visits GROUP BY region",
    "SELECT device, SUM(duration) AS total FROM visits WHERE age >= 30 GROUP BY device",
    "SELECT COUNT(DISTINCT user_id) FROM visits WHERE region = 'north'",
    "SELECT city, COUNT(*) FROM visits GROUP BY city",
    "SELECT region, device, COUNT(*) FROM visits GROUP BY region, device ORDER BY 3 DESC",
    "SELECT is_new, AVG(duration) FROM visits GROUP BY is_new",
    "SELECT MEDIAN(income) FROM visits",
    "SELECT region, QUANTILE_CONT(duration, 0.9) FROM visits GROUP BY region",
    "SELECT PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age) FROM visits",
    "SELECT COUNT(*) FROM visits WHERE zip LIKE '1%'",
    "SELECT visits.region, COUNT(*) FROM visits JOIN regions ON visits.region = regions.region WHERE regions.country = 'A' GROUP BY visits.region",
    "SELECT regions.country, SUM(income) FROM visits JOIN regions ON visits.region = regions.region GROUP BY regions.country",
    "SELECT region, STDDEV_SAMP(age), VAR_POP(age) FROM visits GROUP BY region",
    "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM visits GROUP BY m",
    "SELECT COUNT(*) FROM visits WHERE visit_date >= '2024-06-01'",
]:
    ok(q, "base", S)
no("SELECT ssn, COUNT(*) FROM visits GROUP BY ssn", DENIED, S)
no("SELECT zip, COUNT(*) FROM visits GROUP BY zip", r"filter", S)
no("SELECT user_id, SUM(income) FROM visits GROUP BY user_id", UNIT, S)
no("SELECT AVG(income) FROM visits v1 JOIN visits v2 ON v1.city = v2.city", UNIT + r"|itself|self", S)
no("SELECT region, income FROM visits", RAW, S)
no("SELECT COUNT(*) FROM visits; DROP TABLE visits", r"statements", S)
no("SELECT SUM(city) FROM visits", r"bounds|numeric|not numeric", S)
no("SELECT AVG(LENGTH(ssn)) FROM visits", DENIED, S)
no("SELECT COUNT(*) FROM read_csv('/etc/passwd')", r"policy table|table function|not allowed", S)
no("SELECT list(city) FROM visits", r"LIST|not supported|aggregate", S)
no("SELECT string_agg(city, ',') FROM visits", r"STRING_AGG|not supported|aggregate", S)
no("SELECT region, ARBITRARY(income) FROM visits GROUP BY region", r"not supported|aggregate", S)
no("SELECT region, FIRST(age) FROM visits GROUP BY region", r"not supported|aggregate", S)
no("SELECT city, COUNT(*) FROM visits GROUP BY city", r"delta", "bq:visits", delta=0.0)

# ---------------------------------------------------------------------------------------
# Uber Chorus / elastic sensitivity style workload (written for this corpus).
S = "ch:style of the Chorus / elastic sensitivity workload (trips)"
for q in [
    "SELECT COUNT(*) FROM trips WHERE city_id = 1",
    "SELECT COUNT(*) FROM trips WHERE status = 'completed' AND city_id IN (1, 2, 3)",
    "SELECT city_id, COUNT(*) FROM trips GROUP BY city_id",
    "SELECT city_id, AVG(distance_km) FROM trips GROUP BY city_id ORDER BY city_id",
    "SELECT COUNT(DISTINCT rider_id) FROM trips WHERE status = 'completed'",
    "SELECT SUM(fare) FROM trips WHERE distance_km > 10",
    "SELECT cities.country, COUNT(*) FROM trips JOIN cities ON trips.city_id = cities.city_id GROUP BY cities.country",
    "SELECT cities.city_name, AVG(fare) FROM trips JOIN cities ON trips.city_id = cities.city_id GROUP BY cities.city_name",
    "SELECT status, COUNT(*), AVG(fare) FROM trips GROUP BY status",
    "SELECT COUNT(*) FROM trips LEFT JOIN cities ON trips.city_id = cities.city_id WHERE cities.country = 'US'",
]:
    ok(q, "base", S)
ok("SELECT AVG(trips_per_rider) FROM (SELECT rider_id, COUNT(*) AS trips_per_rider FROM trips GROUP BY rider_id) t", "1", S)
ok("SELECT AVG(spend) FROM (SELECT rider_id, SUM(fare) AS spend FROM trips WHERE status = 'completed' GROUP BY rider_id) AS per_rider", "1", S)
ok("SELECT COUNT(*) FROM (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id) AS r WHERE n >= 5", "1", S)
ok("SELECT n, COUNT(*) FROM (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id) AS r GROUP BY n", "1", S)
ok("SELECT city_id, COUNT(*) FROM (SELECT rider_id, city_id FROM trips WHERE fare > 20) t GROUP BY city_id", "base", S)
ok("SELECT COUNT(DISTINCT driver_id) FROM trips", "9", S)
ok("SELECT city_id, COUNT(DISTINCT driver_id) FROM trips GROUP BY city_id", "9", S)
ok("SELECT MAX(fare) FROM trips", "9", S)
ok("SELECT city_id, MIN(distance_km), MAX(distance_km) FROM trips GROUP BY city_id", "9", S)
ok("SELECT EXTRACT(hour FROM requested_at) AS h, COUNT(*) FROM trips GROUP BY h", "7", S)
ok("SELECT EXTRACT(year FROM requested_at), COUNT(*) FROM trips GROUP BY 1", "7", S)
ok("SELECT COUNT(*) FROM trips WHERE requested_at >= TIMESTAMP '2023-06-01 00:00:00'", "7", S)
ok("SELECT COUNT(*) FROM trips WHERE CAST(requested_at AS DATE) = DATE '2023-03-01'", "7", S)
ok("SELECT month(requested_at) AS m, SUM(fare) FROM trips GROUP BY m ORDER BY m", "7", S)
ok("SELECT year(requested_at), AVG(fare) FROM trips GROUP BY year(requested_at)", "7", S)
no("SELECT SUM(fare / distance_km) FROM trips", r"bounds|interval|divi|zero", S)
ok("SELECT SUM(fare * 0.2) AS commission FROM trips", "6", S)
ok("SELECT AVG(fare / 1000.0) FROM trips", "6", S)
ok("SELECT COUNT(1) FROM trips", "6", S)
ok("SELECT SUM(CASE WHEN status = 'cancelled' THEN 1 ELSE 0 END) AS cancelled FROM trips", "6", S)
ok("SELECT city_id, SUM(CAST(distance_km AS INTEGER)) FROM trips GROUP BY city_id", "6", S)
ok("SELECT COUNT(*) FROM trips WHERE city_id IN (SELECT city_id FROM cities WHERE country = 'US')", "11", S)
ok("SELECT COUNT(*) FROM trips t, cities c WHERE t.city_id = c.city_id AND c.country = 'FR'", "11", S)
ok("SELECT c.country, COUNT(*) FROM trips t JOIN cities c USING (city_id) GROUP BY c.country", "11", S)
ok("SELECT COUNT(*) FROM trips t JOIN cities c ON t.city_id = c.city_id AND c.country = 'BR'", "11", S)
ok("SELECT COUNT(*) FROM trips WHERE EXISTS (SELECT 1 FROM cities WHERE cities.city_id = trips.city_id AND cities.country = 'IN')", "11", S)
ok("SELECT country, COUNT(*) FROM cities GROUP BY country", "8", S)
ok("SELECT city_name FROM cities WHERE country = 'US' ORDER BY city_name", "8", S)
ok("SELECT * FROM cities", "8", S)
ok("SELECT COUNT(*) FROM cities", "8", S)
ok("SELECT n_name, r_name FROM nation JOIN region ON n_regionkey = r_regionkey", "8", S)
no("SELECT trips.driver_id, COUNT(*) FROM trips GROUP BY trips.driver_id", r"filter", S)
no("SELECT COUNT(*) FROM trips t1 JOIN trips t2 ON t1.driver_id = t2.driver_id", UNIT + r"|itself|self", S)
no("SELECT rider_id FROM trips WHERE fare > 150", UNIT + "|" + RAW, S)
no("SELECT COUNT(*) FROM trips WHERE rider_id IN (SELECT rider_id FROM trips WHERE fare > 150 LIMIT 1)", r"subquer|LIMIT", S)
no("SELECT COUNT(*) FROM trips CROSS JOIN cities", r"CROSS|cross", S)
no("SELECT COUNT(*) FROM trips FULL JOIN cities ON trips.city_id = cities.city_id", r"FULL", S)
no("SELECT fare, COUNT(*) FROM trips GROUP BY ALL", r"GROUP BY ALL|raw", S)
no("SELECT city_id, COUNT(*) FROM trips GROUP BY ROLLUP (city_id)", r"ROLLUP", S)

# ---------------------------------------------------------------------------------------
# Categories the peers exercise lightly, written for this corpus (dp:).
S = "dp:issue 14 categories"
# 1. derived tables and CTEs
ok("WITH per_user AS (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id) SELECT AVG(n) FROM per_user", "1", S)
ok("WITH per_user AS (SELECT user_id, SUM(duration) AS t FROM visits GROUP BY user_id) SELECT SUM(t), AVG(t) FROM per_user", "1", S)
ok("SELECT AVG(n) FROM (SELECT user_id, COUNT(*) AS n FROM visits WHERE device = 'mobile' GROUP BY user_id) s", "1", S)
ok("SELECT region, AVG(n) FROM (SELECT user_id, region, COUNT(*) AS n FROM visits GROUP BY user_id, region) s GROUP BY region", "1", S)
ok("SELECT COUNT(*) FROM (SELECT user_id, AVG(age) AS a FROM visits GROUP BY user_id) s WHERE a > 40", "1", S)
ok("SELECT AVG(m) FROM (SELECT user_id, MAX(duration) AS m FROM visits GROUP BY user_id) s", "1", S)
ok("WITH v AS (SELECT * FROM visits WHERE age > 30) SELECT region, COUNT(*) FROM v GROUP BY region", "base", S)
ok("WITH v AS (SELECT user_id, region, income FROM visits), r AS (SELECT * FROM regions) SELECT r.country, AVG(v.income) FROM v JOIN r ON v.region = r.region GROUP BY r.country", "1", S)
ok("SELECT COUNT(*) FROM (SELECT * FROM (SELECT user_id, age FROM visits) a WHERE age > 50) b", "1", S)
no("SELECT AVG(n) FROM (SELECT city, COUNT(*) AS n FROM visits GROUP BY city) s", r"per unit|privacy unit|GROUP BY|unit", S)
no("SELECT user_id, n FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id) s", UNIT + "|" + RAW, S)
# 3. GROUP BY without aggregates
ok("SELECT city FROM visits GROUP BY city", "3", S)
ok("SELECT region FROM visits GROUP BY region", "3", S)
ok("SELECT DISTINCT city FROM visits", "3", S)
ok("SELECT DISTINCT region, device FROM visits", "3", S)
no("SELECT DISTINCT zip FROM visits", r"filter", S)
no("SELECT DISTINCT user_id FROM visits", UNIT, S)
# 5. spellings
ok("SELECT VAR(income) FROM visits", "5", S)
ok("SELECT STDEV(income), VARIANCE(age), STD(duration) FROM visits", "5", S)
ok("SELECT region, STDEVP(age), VARP(age) FROM visits GROUP BY region", "5", S)
# 6. aggregates over expressions, bounds by interval arithmetic or narrowed by the analyst
ok("SELECT SUM(income * 0.3) FROM visits", "6", S)
ok("SELECT SUM(income - 1000) FROM visits", "6", S)
ok("SELECT AVG(duration / 60) AS minutes FROM visits", "6", S)
ok("SELECT SUM(CASE WHEN age > 65 THEN income ELSE 0 END) FROM visits", "6", S)
ok("SELECT COUNT(CASE WHEN age > 65 THEN 1 END) FROM visits", "6", S)
ok("SELECT AVG(CASE WHEN is_new THEN 1.0 ELSE 0.0 END) AS share_new FROM visits", "6", S)
ok("SELECT SUM(LEAST(GREATEST(income, 0), 1000)) FROM visits", "6", S)
ok("SELECT SUM(ABS(age - 50)) FROM visits", "6", S)
ok("SELECT region, SUM(age) FILTER (WHERE device = 'mobile') FROM visits GROUP BY region", "6", S)
ok("SELECT COUNT(*) FILTER (WHERE age < 30), COUNT(*) FILTER (WHERE age >= 30) FROM visits", "6", S)
ok("SELECT SUM(age * duration) FROM visits", "6", S)
ok("SELECT COUNT(age) FILTER (WHERE is_new) FROM visits", "6", S)
no("SELECT SUM(LENGTH(city)) FROM visits", r"bounds|interval|LENGTH|not supported", S)
no("SELECT SUM(age / duration) FROM visits", r"bounds|interval|divi|zero", S)
# 7. casts, EXTRACT, dates
ok("SELECT COUNT(*) FROM visits WHERE CAST(age AS DOUBLE) > 40.5", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE age::VARCHAR = '40'", "7", S)
ok("SELECT CAST(age / 10 AS INTEGER) * 10 AS decade, COUNT(*) FROM visits GROUP BY decade", "7", S)
ok("SELECT EXTRACT(month FROM visit_date) AS m, COUNT(*) FROM visits GROUP BY m", "7", S)
ok("SELECT year(visit_date) AS y, month(visit_date) AS m, COUNT(*) FROM visits GROUP BY y, m", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE visit_date BETWEEN DATE '2024-02-01' AND DATE '2024-02-29'", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE visit_date + 30 < DATE '2024-12-01'", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE visit_ts < TIMESTAMP '2024-03-01 12:00:00'", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE zip = 12345", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE CAST(zip AS INTEGER) BETWEEN 10000 AND 20000", "7", S)
ok("SELECT dayofweek(visit_date) AS d, COUNT(*) FROM visits GROUP BY d", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE EXTRACT(year FROM visit_ts) = 2024", "7", S)
ok("SELECT COUNT(*) FROM visits WHERE age::DOUBLE / 2 > 20", "7", S)
# 8. public tables only
ok("SELECT country, COUNT(*) FROM regions GROUP BY country", "8", S)
ok("SELECT region FROM regions WHERE country = 'A'", "8", S)
ok("SELECT COUNT(*) FROM part WHERE p_size > 10", "8", S)
ok("SELECT p_brand, AVG(p_size) FROM part GROUP BY p_brand ORDER BY 2 DESC LIMIT 3", "8", S)
# 9. MIN / MAX, COUNT(DISTINCT non-unit)
ok("SELECT MIN(age), MAX(age) FROM visits", "9", S)
ok("SELECT region, MAX(income) FROM visits GROUP BY region", "9", S)
ok("SELECT COUNT(DISTINCT city) FROM visits", "9", S)
ok("SELECT region, COUNT(DISTINCT city) FROM visits GROUP BY region", "9", S)
ok("SELECT COUNT(DISTINCT device) FROM visits", "9", S)
no("SELECT MIN(zip) FROM visits", r"filter|bounds", S)
no("SELECT MAX(user_id) FROM visits", UNIT, S)
# 10. output aliases that shadow source columns
ok("SELECT region, SUM(income) AS income FROM visits GROUP BY region ORDER BY income DESC", "10", S)
ok("SELECT region, AVG(age) AS age FROM visits GROUP BY region HAVING age > 30", "10", S)
ok("SELECT device, COUNT(*) AS duration FROM visits GROUP BY device ORDER BY duration", "10", S)
# 11. joins
ok("SELECT COUNT(*) FROM visits v JOIN regions r ON v.region = r.region AND r.country = 'B'", "11", S)
ok("SELECT r.country, COUNT(*) FROM visits v JOIN regions r USING (region) GROUP BY r.country", "11", S)
ok("SELECT r.country, COUNT(*) FROM visits v, regions r WHERE v.region = r.region GROUP BY r.country", "11", S)
ok("SELECT COUNT(*) FROM visits WHERE region IN (SELECT region FROM regions WHERE country = 'A')", "11", S)
ok("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = v.region AND r.country = 'B')", "11", S)
ok("SELECT COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM regions r WHERE r.region = v.region AND r.country = 'B')", "11", S)
ok("SELECT COUNT(*) FROM visits a JOIN visits b ON a.user_id = b.user_id WHERE a.device = 'mobile' AND b.device = 'desktop'", "11", S)
ok("SELECT COUNT(*) FROM (visits) AS v", "11", S)
ok("SELECT COUNT(*) FROM visits WHERE user_id IN (SELECT user_id FROM visits WHERE device = 'tablet')", "11", S)
ok("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey AND o.o_orderstatus = 'F'", "11", S)
ok("SELECT COUNT(*) FROM customer c, orders o WHERE c.c_custkey = o.o_custkey AND o.o_totalprice > 1000", "11", S)
ok("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN nation n ON c.c_nationkey = n.n_nationkey WHERE n.n_regionkey = 1", "11", S)
no("SELECT COUNT(*) FROM visits v JOIN trips t ON v.age = t.city_id", UNIT + r"|privacy units", S)
no("SELECT COUNT(*) FROM visits WHERE city IN (SELECT city FROM visits GROUP BY city HAVING COUNT(*) = 1)", r"subquer|aggregate", S)
# 12. names and TOP
ok("SELECT COUNT(*) FROM main.visits", "12", S)
ok("SELECT COUNT(*) FROM memory.main.visits", "12", S)
ok("SELECT v.region, COUNT(*) FROM main.visits AS v GROUP BY v.region", "12", S)
ok("SELECT TOP 3 region, COUNT(*) AS n FROM visits GROUP BY region ORDER BY n DESC", "12", S)
no("SELECT COUNT(*) FROM secret.visits_raw", r"not in the policy|policy", S)
# dialects
ok("SELECT region, COUNT(*) AS n FROM `visits` GROUP BY region", "dialect", "dp:bigquery dialect", dialect="bigquery")
ok("SELECT TOP 2 region, COUNT(*) AS n FROM [visits] GROUP BY region ORDER BY n DESC", "dialect", "dp:tsql dialect", dialect="tsql")
ok("SELECT region, COUNT(*) AS n FROM visits WHERE visit_date >= DATE '2024-01-01' GROUP BY region", "dialect", "dp:postgres dialect", dialect="postgres")
ok("SELECT region, AVG(income) FROM visits GROUP BY region", "dialect", "dp:spark dialect", dialect="spark")
ok("SELECT IIF(COUNT(*) > 10, 'many', 'few') FROM visits", "dialect", "dp:tsql dialect", dialect="tsql")
ok("SELECT region, COUNT(*) AS n FROM visits GROUP BY region LIMIT 2", "dialect", "dp:mysql dialect", dialect="mysql")
# output-side functions
ok("SELECT ROUND(AVG(income), 2), COUNT(*) / 100.0 FROM visits", "out", S)
ok("SELECT region, CASE WHEN COUNT(*) > 100 THEN 'big' ELSE 'small' END FROM visits GROUP BY region", "base", S)
ok("SELECT SQRT(VAR_POP(age)) FROM visits", "base", S)
ok("SELECT COALESCE(SUM(income), 0) FROM visits", "base", S)
ok("SELECT region, COUNT(*) AS n, 100.0 * COUNT(*) / SUM(COUNT(*)) OVER () AS pct FROM visits GROUP BY region", "out", S)
