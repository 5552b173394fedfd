//! `gpuq._gpuq`: the extension module behind `import gpuq`. A [`Store`] is a store and a
//! DataFusion session over it (the CLI's); [`Result`] is a planned query whose rows reach
//! Python through the Arrow C stream interface (`__arrow_c_stream__`), a batch at a time, so
//! pyarrow, pandas, polars and DuckDB read them without a copy and a large result never sits
//! whole in memory. Work runs on a shared Tokio runtime with the GIL released; errors raise
//! `gpuq.GpuqError` with gpuq's message. The Python package (`gpuq/__init__.py`) adds the
//! conversions and a method per analysis.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use gpuq_engine::{RunId, Store as StoreDir};
use gpuq_export::report::ReportOptions;
use gpuq_export::{Format, WholeFile, Window};
use gpuq_ingest::{IngestOptions, NoProgress};
use gpuq_query::arrow_stream::{c_stream, BlockingReader};
use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList};
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

pyo3::create_exception!(
    _gpuq,
    GpuqError,
    PyException,
    "An error of gpuq: a bad query (with its position), an unknown run, a bad input file (with its position)."
);

/// One runtime for every store of the process.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("gpuq")
        .build()
        .expect("a Tokio runtime")
});

fn error(e: impl std::fmt::Display) -> PyErr {
    GpuqError::new_err(e.to_string())
}

/// How often running work looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Runs Python's signal handlers (on the main thread; elsewhere nothing is pending): the
/// KeyboardInterrupt of a Ctrl-C comes back as the error.
fn pending_signal() -> PyResult<()> {
    Python::attach(|py| py.check_signals())
}

/// Runs `work` with the GIL released, looking for Ctrl-C meanwhile: an interrupt drops the
/// work (DataFusion cancels its tasks) and raises KeyboardInterrupt.
fn run_work<T: Send>(
    py: Python<'_>,
    work: impl Future<Output = PyResult<T>> + Send,
) -> PyResult<T> {
    py.detach(|| {
        RUNTIME.block_on(async {
            tokio::pin!(work);
            loop {
                tokio::select! {
                    done = &mut work => break done,
                    _ = tokio::time::sleep(SIGNAL_POLL) => pending_signal()?,
                }
            }
        })
    })
}

/// [`run_work`] of a DataFusion future.
fn run<T: Send>(
    py: Python<'_>,
    work: impl Future<Output = datafusion::error::Result<T>> + Send,
) -> PyResult<T> {
    run_work(py, async { work.await.map_err(error) })
}

/// A store and a session over it.
#[pyclass(frozen, module = "gpuq._gpuq")]
struct Store {
    store: StoreDir,
    ctx: SessionContext,
}

/// Opens (or creates) the store at `path`.
#[pyfunction]
fn open(py: Python<'_>, path: PathBuf) -> PyResult<Store> {
    py.detach(|| {
        let store = StoreDir::open(&path).map_err(error)?;
        let ctx = RUNTIME
            .block_on(gpuq_query::open_session(&store))
            .map_err(error)?;
        Ok(Store { store, ctx })
    })
}

/// A SQL literal of a Python value: None, bool, int, float or str.
fn literal(v: &Bound<'_, PyAny>) -> PyResult<String> {
    if v.is_none() {
        return Ok("NULL".into());
    }
    if let Ok(b) = v.extract::<bool>() {
        return Ok(if b { "TRUE" } else { "FALSE" }.into());
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(i.to_string());
    }
    if let Ok(f) = v.extract::<f64>() {
        if f.is_finite() {
            return Ok(format!("{f:?}"));
        }
    }
    if let Ok(s) = v.extract::<String>() {
        return Ok(format!("'{}'", s.replace('\'', "''")));
    }
    Err(GpuqError::new_err(format!(
        "an argument must be None, a bool, an int, a float or a str, not {}",
        v.get_type().name()?
    )))
}

/// Whether `run` is in the store, as an error naming the store when not.
fn known_run(store: &StoreDir, run: &str) -> PyResult<()> {
    let id = RunId::new(run).map_err(error)?;
    if store.manifest().map_err(error)?.runs.contains_key(&id) {
        Ok(())
    } else {
        Err(error(format!("no run {run} in {}", store.root().display())))
    }
}

#[pymethods]
impl Store {
    /// The store's directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.store.root().to_path_buf()
    }

    /// Plans `query` (errors now, with their position) and returns its result, read when
    /// consumed.
    fn sql(&self, py: Python<'_>, query: &str) -> PyResult<Result> {
        let df = run(py, self.ctx.sql(query))?;
        Ok(Result { df })
    }

    /// `SELECT * FROM name(args...)`: a table function or analysis with SQL literals of
    /// `args`.
    fn call(&self, py: Python<'_>, name: &str, args: Vec<Bound<'_, PyAny>>) -> PyResult<Result> {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(GpuqError::new_err(format!("no table function {name:?}")));
        }
        let args = args.iter().map(literal).collect::<PyResult<Vec<_>>>()?;
        self.sql(py, &format!("SELECT * FROM {name}({})", args.join(", ")))
    }

    /// Ingests `paths` (Kineto JSON, Nsight Systems SQLite, rocprofv3 CSV, stage logs) into
    /// `run` (default: from each file's name), appending to it when it exists; returns a dict
    /// per run stored.
    #[pyo3(signature = (paths, run=None, tags=None, replace=false, rank=None))]
    fn ingest<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<PathBuf>,
        run: Option<String>,
        tags: Option<Vec<(String, String)>>,
        replace: bool,
        rank: Option<i32>,
    ) -> PyResult<Bound<'py, PyList>> {
        let opts = IngestOptions {
            run: run.map(RunId::new).transpose().map_err(error)?,
            tags: tags.unwrap_or_default(),
            replace,
            rank,
            ..IngestOptions::default()
        };
        let reports = py.detach(|| {
            gpuq_ingest::ingest(&self.store, &paths, &opts, &NoProgress).map_err(error)
        })?;
        let out = PyList::empty(py);
        for r in reports {
            let d = PyDict::new(py);
            d.set_item("run", r.run.as_str())?;
            d.set_item("files", r.files)?;
            d.set_item("events", r.events)?;
            d.set_item("kernels", r.kernels)?;
            d.set_item("appended", r.appended)?;
            d.set_item("duplicates", r.duplicates.len())?;
            d.set_item("warnings", r.warnings.into_iter().collect::<Vec<_>>())?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Writes `run` (or a window of it) as a Perfetto (`perfetto`) or Chrome JSON (`chrome`)
    /// timeline at `path`, whole or not at all; returns what was written.
    #[pyo3(signature = (run, path, format="perfetto", steps=None, from_ns=None, to_ns=None, ranks=None, min_dur=0, findings=true))]
    #[allow(clippy::too_many_arguments)]
    fn export<'py>(
        &self,
        py: Python<'py>,
        run: &str,
        path: PathBuf,
        format: &str,
        steps: Option<String>,
        from_ns: Option<i64>,
        to_ns: Option<i64>,
        ranks: Option<Vec<i32>>,
        min_dur: i64,
        findings: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let format = match format {
            "perfetto" => Format::Perfetto,
            "chrome" => Format::Chrome,
            other => {
                return Err(error(format!(
                    "unknown format {other:?}: perfetto or chrome"
                )))
            }
        };
        known_run(&self.store, run)?;
        let window = Window {
            steps,
            from: from_ns,
            to: to_ns,
            ranks: ranks.unwrap_or_default(),
            min_dur,
            skip_findings: !findings,
        };
        let mut out = WholeFile::create(&path).map_err(error)?;
        let summary = run_work(py, async {
            let summary = gpuq_export::export(&self.ctx, run, &window, format, &mut out.file)
                .await
                .map_err(error)?;
            Ok(summary)
        })?;
        out.commit().map_err(error)?;
        let d = PyDict::new(py);
        d.set_item("path", path)?;
        d.set_item("slices", summary.slices)?;
        d.set_item("instants", summary.instants)?;
        d.set_item("counters", summary.counters)?;
        d.set_item("flows", summary.flows)?;
        d.set_item("tracks", summary.tracks)?;
        d.set_item("from_ns", summary.from_ns)?;
        d.set_item("to_ns", summary.to_ns)?;
        Ok(d)
    }

    /// The HTML report of `run` (against `baseline` when given): written at `path` (whole or
    /// not at all) and its path returned, or returned as a string when `path` is None.
    #[pyo3(signature = (run, path=None, baseline=None, steps=None, top=None))]
    fn report(
        &self,
        py: Python<'_>,
        run: &str,
        path: Option<PathBuf>,
        baseline: Option<String>,
        steps: Option<String>,
        top: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        for r in std::iter::once(run).chain(baseline.as_deref()) {
            known_run(&self.store, r)?;
        }
        let opts = ReportOptions {
            run: run.to_string(),
            baseline,
            steps,
            top: top.unwrap_or(gpuq_export::report::DEFAULT_TOP),
        };
        let html = run_work(py, async {
            gpuq_export::report::report(&self.ctx, &opts)
                .await
                .map_err(error)
        })?;
        match path {
            None => Ok(html.into_pyobject(py)?.into_any().unbind()),
            Some(path) => {
                let mut out = WholeFile::create(&path).map_err(error)?;
                out.file.write_all(html.as_bytes()).map_err(error)?;
                out.commit().map_err(error)?;
                Ok(path.into_pyobject(py)?.into_any().unbind())
            }
        }
    }
}

/// Set when Ctrl-C ended a stream a consumer (pyarrow, polars, DuckDB) was reading: the
/// consumer raises its own error, which `gpuq`'s wrappers turn back into KeyboardInterrupt.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether Ctrl-C ended a stream since the last call (and clears it).
#[pyfunction]
fn take_interrupt() -> bool {
    INTERRUPTED.swap(false, Ordering::SeqCst)
}

/// The analyses as (name, parameters after the run), `steps` last where one is taken.
#[pyfunction]
fn analyses() -> Vec<(String, Vec<String>)> {
    gpuq_query::analyses::specs()
        .into_iter()
        .map(|s| {
            let mut params: Vec<String> = s.params.iter().map(|p| p.to_string()).collect();
            if s.takes_steps() {
                params.push("steps".into());
            }
            (s.name.to_string(), params)
        })
        .collect()
}

/// A planned query; each consumption runs it and streams its rows.
#[pyclass(frozen, module = "gpuq._gpuq")]
struct Result {
    df: DataFrame,
}

impl Result {
    fn head(&self, py: Python<'_>, n: usize) -> PyResult<Vec<RecordBatch>> {
        let df = self.df.clone();
        run(py, async { df.limit(0, Some(n))?.collect().await })
    }
}

#[pymethods]
impl Result {
    /// The Arrow C stream of the rows (PyCapsule `arrow_array_stream`): pulled a batch at a
    /// time by the consumer. `requested_schema` is not honoured: the columns come as they are.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let df = self.df.clone();
        let stream = run(py, df.execute_stream())?;
        // The consumer (pyarrow, polars, DuckDB) pulls batches from C: a Ctrl-C meanwhile
        // ends the stream with an error and is raised again as KeyboardInterrupt once the
        // consumer returns to Python.
        let reader = BlockingReader::new(stream, RUNTIME.handle().clone()).interrupt_when(
            || {
                Python::attach(|py| {
                    let e = py.check_signals().err()?;
                    if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                        INTERRUPTED.store(true, Ordering::SeqCst);
                        Some("query interrupted by Ctrl-C".to_string())
                    } else {
                        Some(format!("query interrupted: {e}"))
                    }
                })
            },
            SIGNAL_POLL,
        );
        let ffi = c_stream(reader);
        PyCapsule::new_with_value(py, ffi, c"arrow_array_stream")
    }

    /// The column names.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.df
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The first `n` rows as an HTML table (Jupyter's display).
    #[pyo3(signature = (n=40))]
    fn html(&self, py: Python<'_>, n: usize) -> PyResult<String> {
        let batches = self.head(py, n + 1)?;
        let columns = self.columns();
        let mut h = String::from("<table><thead><tr>");
        for c in &columns {
            h.push_str(&format!("<th>{}</th>", esc(c)));
        }
        h.push_str("</tr></thead><tbody>");
        let options = FormatOptions::default().with_null("NULL");
        let mut shown = 0;
        'rows: for b in &batches {
            let formatters = b
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(error)?;
            for row in 0..b.num_rows() {
                if shown == n {
                    h.push_str(&format!(
                        "<tr><td colspan=\"{}\">more rows not shown</td></tr>",
                        columns.len()
                    ));
                    break 'rows;
                }
                h.push_str("<tr>");
                for f in &formatters {
                    h.push_str(&format!("<td>{}</td>", esc(&f.value(row).to_string())));
                }
                h.push_str("</tr>");
                shown += 1;
            }
        }
        h.push_str("</tbody></table>");
        Ok(h)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let batches = self.head(py, 10)?;
        let table =
            datafusion::arrow::util::pretty::pretty_format_batches(&batches).map_err(error)?;
        Ok(format!(
            "gpuq result ({} columns; first rows)\n{table}",
            self.columns().len()
        ))
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[pymodule]
fn _gpuq(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(analyses, m)?)?;
    m.add_function(wrap_pyfunction!(take_interrupt, m)?)?;
    m.add_class::<Store>()?;
    m.add_class::<Result>()?;
    m.add("GpuqError", m.py().get_type::<GpuqError>())?;
    Ok(())
}
