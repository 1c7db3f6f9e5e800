"""History: each night's results, per test, in one SQLite file carried from night to night, and the trends read
from it (`harness history append`, `harness trend`). Runs in the nightly's regression job, or by hand.

By stage: `store` (open a database, read-only where only read, refuse what is not one, apply `migrations/*.sql`,
and `repack`'s data step for version 3), `schema` (the objects a database may hold: the migrations' alone),
`night_reader` (results folders -> what the history keeps of each test, in one streaming pass), `append` (a night
into rows), `rows` and `packing` (one row per night and cell, its columns compressed arrays), `rule` (the creep
rule, pure), `query` (rows back, checked again: the file is an artifact) and `trend` (what the trend page and the
nightly issue show, as data, and the issue's reading of it back). Rendering is harness.report's.
"""

from harness.history.append import KEEP_NIGHTS, Appended, append_night, night_date
from harness.history.rule import BASELINE_NIGHTS, CONFIRM_NIGHTS, METRICS, Creep, Metric, Night, creeps
from harness.history.store import migrations, open_history, read_history, schema_version
from harness.history.trend import PLOTTED_TESTS, Regression, Trend, build_trend

__all__ = [
    "BASELINE_NIGHTS",
    "CONFIRM_NIGHTS",
    "KEEP_NIGHTS",
    "METRICS",
    "PLOTTED_TESTS",
    "Appended",
    "Creep",
    "Metric",
    "Night",
    "Regression",
    "Trend",
    "append_night",
    "build_trend",
    "creeps",
    "migrations",
    "night_date",
    "open_history",
    "read_history",
    "schema_version",
]
