"""What DuckDB and polars read from a gpuq store: per run, its events and kernels.

usage: engines.py STORE DUCKDB_EXPR POLARS_FILES_JSON
  DUCKDB_EXPR        `gpuq files --format duckdb` (a read_parquet call over the version's files)
  POLARS_FILES_JSON  `gpuq files --format json`

Prints one line per source and run: SOURCE RUN EVENTS KERNELS. The sources are the README's
Hive glob read by DuckDB and by polars, and the version's files read by each.
"""
import glob
import json
import os
import sys

import duckdb
import polars as pl

store, duckdb_expr, files_json = sys.argv[1], sys.argv[2], sys.argv[3]
files = json.loads(files_json)
hive_glob = os.path.join(store, "events/*/*.parquet")
globbed = glob.glob(hive_glob)


def duck(source):
    sql = (
        "SELECT run, count(*), count(*) FILTER (WHERE kind = 'kernel') "
        f"FROM {source} GROUP BY run"
    )
    return duckdb.sql(sql).fetchall()


def polars(frame):
    counts = frame.group_by("run").agg(
        pl.len().alias("events"),
        (pl.col("kind").cast(pl.String) == "kernel").sum().alias("kernels"),
    )
    return counts.collect().iter_rows()


sources = {
    # Both engines fail on a glob that matches nothing: an empty store has no rows.
    "duckdb-glob": globbed
    and duck(f"read_parquet('{hive_glob}', hive_partitioning = true)"),
    "polars-glob": globbed and polars(pl.scan_parquet(hive_glob, hive_partitioning=True)),
    "duckdb-files": files and duck(duckdb_expr),
    "polars-files": files and polars(pl.scan_parquet(files, hive_partitioning=True)),
}
for name, rows in sources.items():
    print(name, "-", 0, 0)  # says the source was read, even when it has no runs
    for run, events, kernels in rows or []:
        print(name, run, events, kernels)
