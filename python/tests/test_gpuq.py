"""`import gpuq` against the CLI: the same store, the same SQL, the same numbers.

A store is filled through Python (generated traces, and the real shared traces where
../shared exists) and every check compares a Python result with `gpuq query --format csv`.
The `gpuq` binary is $GPUQ_BIN, else target/release/gpuq under $CARGO_TARGET_DIR.
"""

import io
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

import gpuq

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"


def gpuq_bin():
    if os.environ.get("GPUQ_BIN"):
        return os.environ["GPUQ_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    path = Path(target) / "release" / "gpuq"
    if not path.exists():
        pytest.skip(f"no gpuq binary at {path} (cargo build --release, or set GPUQ_BIN)")
    return str(path)


def require_torch():
    """PyTorch, or a skip where it is not installed (CI installs it and sets
    GPUQ_REQUIRE_TORCH=1, so the test runs there)."""
    import importlib.util

    # Installed but broken is a failure, not a skip.
    if importlib.util.find_spec("torch") is None and os.environ.get("GPUQ_REQUIRE_TORCH") != "1":
        pytest.skip("torch is not installed (GPUQ_REQUIRE_TORCH=1 requires it)")
    import torch

    return torch


def cli(store, *args):
    o = subprocess.run([gpuq_bin(), "--store", str(store), *args], capture_output=True, text=True)
    assert o.returncode == 0, o.stderr
    return o.stdout


def cli_frame(store, sql):
    return pd.read_csv(io.StringIO(cli(store, "query", "--format", "csv", sql)), keep_default_na=False, na_values=[""])


def text(v):
    """A value as the CLI's CSV writes it: NULL empty, booleans lower-case."""
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    if isinstance(v, (bool, type(pd.NA))) or str(type(v)).endswith("bool_'>"):
        return str(v).lower()
    return str(v)


def same_frame(got, want, what):
    """Equal column names, row counts and values (numbers to 1e-9 relative, text exact)."""
    got = got.reset_index(drop=True)
    assert list(got.columns) == list(want.columns), what
    assert len(got) == len(want), what
    for c in want.columns:
        g, w = got[c], want[c]
        if pd.api.types.is_numeric_dtype(w) and not pd.api.types.is_bool_dtype(g):
            g = pd.to_numeric(g.astype("object").where(g.notna(), None), errors="coerce").astype(float)
            w = w.astype(float)
            both_nan = g.isna() & w.isna()
            close = (g - w).abs() <= 1e-9 * w.abs().clip(lower=1.0)
            assert (both_nan | close).all(), f"{what}: column {c}\n{g[~(both_nan | close)].head()}\n{w[~(both_nan | close)].head()}"
        else:
            gs, ws = g.astype("object").map(text), w.astype("object").map(text)
            assert (gs == ws).all(), f"{what}: column {c}\n{gs[gs != ws].head()}\n{ws[gs != ws].head()}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpuq")
    for rank in (0, 1):
        subprocess.run([gpuq_bin(), "generate", str(d / f"r{rank}.json"), "--steps", "6", "--rank", str(rank)],
                       check=True, capture_output=True)
    s = gpuq.open(d / "store")
    reports = s.ingest(d / "r0.json", d / "r1.json", run="gen", tags={"model": "demo", "bs": 8})
    assert reports[0]["run"] == "gen" and reports[0]["files"] == 2 and reports[0]["kernels"] > 0
    if SHARED.is_dir():
        s.ingest(SHARED / "kineto/hta/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz", run="rocm")
        s.ingest(SHARED / "nsys/nsysai_h100_2gpu_1s.sqlite", run="nsys")
    elif os.environ.get("GPUQ_REQUIRE_TRACES") == "1":
        pytest.fail(f"{SHARED} not found and GPUQ_REQUIRE_TRACES=1")
    return s


def runs(store):
    return [r for r in ("gen", "rocm", "nsys") if r in set(store.runs().to_pandas()["run"])]


def test_sql_results_are_the_clis(store):
    for sql in [
        "SELECT name, sum(dur) AS total, count(*) AS n FROM kernels WHERE run = 'gen' GROUP BY name ORDER BY total DESC, name",
        "SELECT run, rank, step, ts, dur FROM steps ORDER BY run, rank, step",
        "SELECT kind, count(*) AS n, min(ts) AS first FROM events GROUP BY kind ORDER BY kind",
        "SELECT run, tags['model'] AS model FROM runs ORDER BY run",
    ]:
        same_frame(store.sql(sql).to_pandas(), cli_frame(store.path, sql), sql)


def test_every_analysis_is_a_method_with_the_clis_rows(store):
    names = [n for n, _ in gpuq._gpuq.analyses()]
    assert {"top_kernels", "gpu_gaps", "breakdown", "findings", "step_stats"} <= set(names)
    for run in runs(store):
        for name in names:
            got = getattr(store, name)(run).to_pandas()
            want = cli_frame(store.path, f"SELECT * FROM {name}('{run}')")
            same_frame(got, want, f"{name}({run})")
    # Arguments by position and by name, as in SQL.
    same_frame(store.top_kernels("gen", 3).to_pandas(), cli_frame(store.path, "SELECT * FROM top_kernels('gen', 3)"), "top 3")
    same_frame(store.gpu_gaps("gen", min_gap_ns=20000).to_pandas(),
               cli_frame(store.path, "SELECT * FROM gpu_gaps('gen', 20000)"), "gaps over 20 us")
    same_frame(store.compare("gen", "gen").to_pandas(), cli_frame(store.path, "SELECT * FROM compare('gen', 'gen')"), "compare")


def test_types_are_exact_nanoseconds_and_categoricals(store):
    df = store.sql("SELECT ts, dur, name, kind FROM events WHERE run = 'gen' LIMIT 1000").to_pandas()
    assert df["ts"].dtype == "int64" and df["dur"].dtype == "int64"
    assert isinstance(df["name"].dtype, pd.CategoricalDtype)
    assert isinstance(df["kind"].dtype, pd.CategoricalDtype)
    first = cli(store.path, "query", "--format", "csv", "SELECT min(ts) FROM events WHERE run = 'gen'").splitlines()[1]
    got = store.sql("SELECT min(ts) AS t FROM events WHERE run = 'gen'").to_arrow()
    assert got.column("t")[0].as_py() == int(first)


def test_any_arrow_consumer_reads_a_result(store):
    r = store.sql("SELECT kind, count(*) AS n FROM events WHERE run = 'gen' GROUP BY kind ORDER BY kind")
    table = pa.table(r)
    assert table.column_names == ["kind", "n"]
    pl = pytest.importorskip("polars")
    frame = r.to_polars()
    assert isinstance(frame, pl.DataFrame) and frame.shape == (table.num_rows, 2)
    assert frame["n"].to_list() == table.column("n").to_pylist()
    duckdb = pytest.importorskip("duckdb")
    n = duckdb.sql("SELECT sum(n) FROM r").fetchall()[0][0]
    assert n == sum(table.column("n").to_pylist())
    # Jupyter shows the first rows as a table.
    html = r._repr_html_()
    assert html.startswith("<table>") and "<th>kind</th>" in html


def test_a_large_result_streams_in_bounded_memory(store):
    sql = "SELECT value AS a, value * 2 AS b, value * 3 AS c FROM range(10000000)"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows = 0
    total = 0
    for batch in store.sql(sql).to_reader():
        rows += batch.num_rows
        total += batch.column(0)[batch.num_rows - 1].as_py()
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert rows == 10_000_000
    # 10 M rows of 3 int64 columns are 240 MB whole; streamed, the peak barely moves.
    assert grew_mb < 80, f"peak RSS grew {grew_mb:.0f} MB"


def test_errors_raise_with_gpuqs_message(store, tmp_path):
    with pytest.raises(gpuq.GpuqError, match="nope"):
        store.sql("SELECT nope FROM events")
    with pytest.raises(gpuq.GpuqError, match="unknown run"):
        store.top_kernels("no-such-run").to_arrow()
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": ')
    with pytest.raises(gpuq.GpuqError, match="bad.json"):
        store.ingest(bad, run="bad")
    assert "bad" not in set(store.runs().to_pandas()["run"])
    with pytest.raises(gpuq.GpuqError, match="no argument"):
        store.top_kernels("gen", bogus=1)


def test_the_torch_handler_appends_each_cycle(tmp_path):
    """torch.profiler's on_trace_ready, fed the generator's cycle files (a profile object that
    writes them as torch's export_chrome_trace does)."""
    class Cycle:
        def __init__(self, first_step):
            self.step_num = first_step + 2
            self.first_step = first_step

        def export_chrome_trace(self, path):
            subprocess.run([gpuq_bin(), "generate", path, "--steps", "2", "--first-step", str(self.first_step)],
                           check=True, capture_output=True)

    s = gpuq.open(tmp_path / "store")
    handler = gpuq.torch_handler(s, "job")
    seen = []
    for first in (0, 2, 4):
        handler(Cycle(first))
        seen.append(s.sql("SELECT count(DISTINCT step) AS n FROM steps WHERE run = 'job'").to_pandas()["n"][0])
    assert seen == [2, 4, 6]
    steps = s.sql("SELECT DISTINCT step FROM steps WHERE run = 'job' ORDER BY step").to_pandas()["step"].tolist()
    assert steps == [0, 1, 2, 3, 4, 5]


def test_a_real_torch_profile_is_stored_cycle_by_cycle(tmp_path):
    """torch.profiler on a real model (CPU activities: the machine may have no GPU) with
    gpuq.torch_handler: each cycle is queryable as soon as the schedule ends it, and the run
    holds exactly the operators and steps of the traces torch wrote, counted here with json."""
    import collections
    import json

    torch = require_torch()
    from torch.profiler import ProfilerActivity, profile, schedule

    s = gpuq.open(tmp_path / "store")
    # torch writes a cycle once: the handler keeps the files it stores, to be counted below.
    store_cycle = gpuq.torch_handler(s, "job", trace_dir=tmp_path / "traces")
    steps_seen = []

    def on_trace_ready(prof):
        store_cycle(prof)
        q = "SELECT count(DISTINCT step) AS n FROM steps WHERE run = 'job'"
        steps_seen.append(int(s.sql(q).to_pandas()["n"][0]))

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 32)
    plan = schedule(wait=1, warmup=1, active=2, repeat=2)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=on_trace_ready) as p:
        for _ in range(8):
            model(x).sum().backward()
            p.step()
    traces = sorted((tmp_path / "traces").glob("*.pt.trace.json"))
    assert len(traces) == 2
    assert steps_seen == [2, 4]
    ops, steps = collections.Counter(), set()
    for path in traces:
        for e in json.loads(path.read_text())["traceEvents"]:
            if e.get("ph") != "X":
                continue
            if e.get("cat") == "cpu_op":
                ops[e["name"]] += 1
            if e.get("name", "").startswith("ProfilerStep#"):
                steps.add(int(e["name"].split("#")[1]))
    # Two layers in each of the four active steps.
    assert ops["aten::linear"] == 8
    stored = s.sql(
        "SELECT name, count(*) AS n FROM events WHERE run = 'job' AND kind = 'cpu_op' GROUP BY name"
    ).to_pandas()
    assert dict(zip(stored["name"], stored["n"].astype(int))) == dict(ops)
    stored_steps = s.sql("SELECT DISTINCT step FROM steps WHERE run = 'job' ORDER BY step").to_pandas()
    assert stored_steps["step"].tolist() == sorted(steps) == [2, 3, 6, 7]


def test_the_default_store_is_the_clis(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUQ_STORE", str(tmp_path / "s"))
    s = gpuq.open()
    assert s.path == tmp_path / "s"
    assert len(s.runs().to_pandas()) == 0


# A query that would run for hours: Ctrl-C must stop it.
ENDLESS = "SELECT sum(value % 7) AS s FROM range(0, 100000000000000)"


@pytest.mark.parametrize("consume", ["to_arrow", "to_polars", "repr"])
def test_ctrl_c_stops_a_running_query(store, consume):
    import signal
    import threading
    import time

    def read():
        r = store.sql(ENDLESS)
        if consume == "repr":
            return repr(r)
        return getattr(r, consume)()

    timer = threading.Timer(0.4, lambda: os.kill(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            read()
            time.sleep(5)  # only reached when the query ignored the signal
    finally:
        timer.cancel()
    assert time.monotonic() - started < 4, "the interrupt was not seen while the query ran"
    # The work stopped: the process burns (almost) no CPU once the interrupt is raised.
    cpu = time.process_time()
    time.sleep(0.6)
    assert time.process_time() - cpu < 0.3, "the query kept running after the interrupt"


def timeline(path):
    """A Perfetto trace's events as sorted (timestamp, type, name or interned id) rows."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    t = Trace()
    t.ParseFromString(path.read_bytes())
    events = [p for p in t.packet if p.HasField("track_event")]
    assert events, path
    return sorted((p.timestamp, p.track_event.type, p.track_event.categories[:1] == ["kernel"])
                  for p in events)


def test_export_and_report_are_the_clis(store, tmp_path):
    first = int(store.sql("SELECT min(step) AS s FROM steps WHERE run = 'gen'").to_pandas()["s"][0])
    steps = f"{first + 1}..{first + 3}"
    summary = store.export("gen", tmp_path / "py.pftrace", steps=steps)
    cli(store.path, "export", "gen", "-o", str(tmp_path / "cli.pftrace"), "--steps", steps)
    # Two ranks' rows reach the writer in the scan's order, which varies from run to run: the
    # same events, not always the same bytes.
    assert timeline(tmp_path / "py.pftrace") == timeline(tmp_path / "cli.pftrace")
    assert summary["slices"] > 0 and summary["from_ns"] < summary["to_ns"]
    chrome = store.export("gen", tmp_path / "py.json", format="chrome", ranks=[1], findings=False)
    cli(store.path, "export", "gen", "-o", str(tmp_path / "cli.json"), "--format", "chrome",
        "--ranks", "1", "--no-findings")
    assert (tmp_path / "py.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    assert chrome["slices"] < summary["slices"] * 10
    with pytest.raises(gpuq.GpuqError, match="unknown format"):
        store.export("gen", tmp_path / "x", format="svg")
    with pytest.raises(gpuq.GpuqError, match="no run nope"):
        store.export("nope", tmp_path / "x")
    assert not (tmp_path / "x").exists() and not (tmp_path / ".x.tmp").exists()

    html = store.report("gen")
    cli(store.path, "report", "gen", "-o", str(tmp_path / "cli.html"))
    assert html == (tmp_path / "cli.html").read_text()
    assert store.report("gen", tmp_path / "py.html") == tmp_path / "py.html"
    assert (tmp_path / "py.html").read_text() == html


def test_the_torch_handler_takes_the_rank_of_torch_distributed(tmp_path, monkeypatch):
    import sys
    import types

    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)

    class Cycle:
        step_num = 2

        def export_chrome_trace(self, path):
            subprocess.run([gpuq_bin(), "generate", path, "--steps", "2"], check=True, capture_output=True)

    s = gpuq.open(tmp_path / "store")
    gpuq.torch_handler(s, "job")(Cycle())
    ranks = s.sql("SELECT DISTINCT rank FROM kernels WHERE run = 'job'").to_pandas()["rank"].tolist()
    assert ranks == [3]
