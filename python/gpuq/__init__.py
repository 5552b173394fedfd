"""gpuq in Python: the store, its SQL and its analyses, as Arrow, pandas and polars.

    import gpuq
    s = gpuq.open()                                   # $GPUQ_STORE, else ~/.local/share/gpuq
    s.ingest("rank0.json.gz", "rank1.json.gz", run="llama-bs8", tags={"model": "llama"})
    s.sql("SELECT name, sum(dur) AS total FROM kernels GROUP BY name").to_pandas()
    s.top_kernels("llama-bs8", 20).to_polars()
    s.compare("main-0412", "pr-1234", level="op").to_arrow()
    s.runs()

Every result implements the Arrow C stream interface (``__arrow_c_stream__``): pyarrow,
pandas, polars and DuckDB take it without a copy, a batch at a time. Errors raise
:class:`GpuqError` with gpuq's message.
"""

import contextlib
import os
from pathlib import Path

from . import _gpuq
from ._gpuq import GpuqError

__all__ = ["open", "Store", "Result", "GpuqError", "torch_handler"]


def default_store():
    """Where the CLI keeps its store: $GPUQ_STORE, else $XDG_DATA_HOME/gpuq or
    ~/.local/share/gpuq."""
    if os.environ.get("GPUQ_STORE"):
        return Path(os.environ["GPUQ_STORE"])
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]) / "gpuq"
    return Path.home() / ".local" / "share" / "gpuq"


def open(path=None):
    """Opens (or creates) the store at ``path`` (default: :func:`default_store`)."""
    path = Path(os.path.expanduser(str(path))) if path is not None else default_store()
    return Store(_gpuq.open(str(path)))


@contextlib.contextmanager
def _interruptible():
    """Ctrl-C while pyarrow or polars read a result ends the stream with their own error;
    raise it as KeyboardInterrupt, as Python code expects."""
    _gpuq.take_interrupt()
    try:
        yield
    except Exception as e:
        if _gpuq.take_interrupt():
            raise KeyboardInterrupt from e
        raise


class Result:
    """A query's rows, read when consumed (each consumption runs the query again)."""

    def __init__(self, inner):
        self._inner = inner

    def __arrow_c_stream__(self, requested_schema=None):
        return self._inner.__arrow_c_stream__(requested_schema)

    @property
    def columns(self):
        return self._inner.columns

    def to_reader(self):
        """A ``pyarrow.RecordBatchReader``: the rows a batch at a time."""
        import pyarrow as pa

        return pa.RecordBatchReader.from_stream(self)

    def to_arrow(self):
        """A ``pyarrow.Table``."""
        with _interruptible():
            return self.to_reader().read_all()

    def to_pandas(self):
        """A ``pandas.DataFrame``: nanoseconds as int64, dictionary columns as categoricals."""
        return self.to_arrow().to_pandas()

    def to_polars(self):
        """A ``polars.DataFrame``."""
        import polars as pl

        with _interruptible():
            return pl.DataFrame(self)

    def _repr_html_(self):
        return self._inner.html(40)

    def __repr__(self):
        return repr(self._inner)


class Store:
    """A gpuq store: its runs, SQL over them, and each analysis as a method."""

    def __init__(self, inner):
        self._inner = inner

    @property
    def path(self):
        return Path(self._inner.path)

    def sql(self, query):
        """The rows of a SQL statement (the CLI's dialect: tables, views, functions)."""
        return Result(self._inner.sql(query))

    def runs(self):
        """The catalog of runs, one row each."""
        return self.sql("SELECT * FROM runs ORDER BY run")

    def ingest(self, *paths, run=None, tags=None, replace=False, rank=None):
        """Stores trace files as ``run`` (appended when it exists, unless ``replace``);
        returns a dict per run stored. ``tags``: a dict of key -> value."""
        if not paths:
            raise GpuqError("ingest needs at least one file")
        items = sorted(tags.items()) if tags else None
        return self._inner.ingest(
            [str(Path(os.path.expanduser(str(p)))) for p in paths],
            run=run,
            tags=[(str(k), str(v)) for k, v in items] if items else None,
            replace=replace,
            rank=rank,
        )

    def export(self, run, path, format="perfetto", steps=None, from_ns=None, to_ns=None,
               ranks=None, min_dur=0, findings=True):
        """Writes ``run`` as a timeline for Perfetto (``format="perfetto"``) or
        chrome://tracing (``"chrome"``), as ``gpuq export`` does: ``steps`` as ``"3..5"``,
        ``from_ns``/``to_ns`` after the run's start, ``ranks`` a list, ``min_dur`` in ns.
        The file appears whole or not at all; returns what was written (a dict)."""
        return self._inner.export(run, str(Path(os.path.expanduser(str(path)))), format=format,
                                  steps=steps, from_ns=from_ns, to_ns=to_ns,
                                  ranks=list(ranks) if ranks is not None else None,
                                  min_dur=min_dur, findings=findings)

    def report(self, run, path=None, baseline=None, steps=None, top=None):
        """``gpuq report``'s HTML page of ``run`` (against ``baseline``): written at
        ``path`` (returned), else returned as a string."""
        if path is not None:
            path = str(Path(os.path.expanduser(str(path))))
        return self._inner.report(run, path, baseline=baseline, steps=steps, top=top)

    def call(self, name, *args):
        """``SELECT * FROM name(args...)``: any table function by name."""
        return Result(self._inner.call(name, list(args)))

    def compare(self, a, b, level=None, threshold_pct=None):
        """``compare(a, b [, level [, threshold_pct]])``: what changed from run (or
        selector) ``a`` to ``b``."""
        return self.call("compare", *_trim([a, b, level, threshold_pct]))

    def trend(self, selector, metric, order_tag=None, threshold_pct=None):
        """``trend(selector, metric [, order_tag [, threshold_pct]])``."""
        return self.call("trend", *_trim([selector, metric, order_tag, threshold_pct]))

    def repeatability(self, selector, n=None):
        """``repeatability(selector [, n])``."""
        return self.call("repeatability", *_trim([selector, n]))


def _trim(args):
    """Arguments without their trailing Nones (left to the function's defaults)."""
    while args and args[-1] is None:
        args = args[:-1]
    return args


def _analysis(name, params):
    def method(self, run, *args, **kwargs):
        values = list(args) + [None] * (len(params) - len(args))
        if len(args) > len(params):
            raise GpuqError(f"{name} takes at most {len(params) + 1} arguments")
        for key, value in kwargs.items():
            if key not in params:
                raise GpuqError(f"{name} has no argument {key!r} (it takes run, {', '.join(params)})")
            values[params.index(key)] = value
        return self.call(name, run, *_trim(values))

    method.__name__ = name
    method.__doc__ = f"``{name}(run{''.join(', ' + p for p in params)})``: the SQL table function's rows."
    return method


for _name, _params in _gpuq.analyses():
    setattr(Store, _name, _analysis(_name, _params))


def torch_handler(store, run, rank=None, tags=None, trace_dir=None):
    """An ``on_trace_ready`` for ``torch.profiler.profile``: each cycle's trace is stored as
    it is written, appended to ``run``, so the run can be queried while the job trains.

        with torch.profiler.profile(schedule=..., on_trace_ready=gpuq.torch_handler(s, "job42")) as p:
            ...

    torch writes a cycle's trace once only (a second ``export_chrome_trace`` raises "Trace is
    already saved"), so this handler cannot follow ``tensorboard_trace_handler`` in one
    ``on_trace_ready``. To keep the trace files too (for TensorBoard or Perfetto), pass
    ``trace_dir``: each cycle is written there under the name tensorboard_trace_handler gives
    (``<host>_<pid>.<ms>.pt.trace.json``) and kept; without it the file is temporary.
    """
    import socket
    import tempfile
    import time

    if not isinstance(store, Store):
        store = open(store)
    if trace_dir is not None:
        os.makedirs(trace_dir, exist_ok=True)

    def store_cycle(prof, directory):
        name = f"{socket.gethostname()}_{os.getpid()}.{time.time_ns() // 1_000_000}.pt.trace.json"
        path = os.path.join(directory, name)
        prof.export_chrome_trace(path)
        store.ingest(path, run=run, rank=rank if rank is not None else distributed_rank(),
                     tags=tags)

    def handler(prof):
        if trace_dir is not None:
            store_cycle(prof, os.fspath(trace_dir))
            return
        with tempfile.TemporaryDirectory(prefix="gpuq-cycle-") as d:
            store_cycle(prof, d)

    return handler


def distributed_rank():
    """This process's rank in ``torch.distributed`` when a process group is up, else None
    (the trace's own ``distributedInfo`` is used then)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        return None
    return None
