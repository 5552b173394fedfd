//! Columnar builders for canonical events and counters, and the host-side structure
//! (operators, annotations, launches, steps) used to attribute GPU work to the model.

use datafusion::arrow::array::{
    ArrayRef, Float64Builder, Int32Builder, Int64Builder, RecordBatch, StringBuilder,
    StringDictionaryBuilder,
};
use datafusion::arrow::datatypes::Int32Type;
use gpuq_engine::schema::{self, TableKind};
use std::collections::HashMap;
use std::sync::Arc;

/// Index of each kind in [`schema::KINDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Kernel = 0,
    Memcpy,
    Memset,
    Sync,
    Runtime,
    Driver,
    CpuOp,
    Annotation,
    GpuAnnotation,
    Python,
    Overhead,
    Instant,
    Other,
}

impl Kind {
    pub fn name(self) -> &'static str {
        schema::KINDS[self as usize]
    }

    /// Work that runs on a GPU stream.
    pub fn is_gpu(self) -> bool {
        matches!(
            self,
            Kind::Kernel | Kind::Memcpy | Kind::Memset | Kind::Sync | Kind::GpuAnnotation
        )
    }

    pub fn is_launch(self) -> bool {
        matches!(self, Kind::Runtime | Kind::Driver)
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        const ALL: [Kind; 13] = [
            Kind::Kernel,
            Kind::Memcpy,
            Kind::Memset,
            Kind::Sync,
            Kind::Runtime,
            Kind::Driver,
            Kind::CpuOp,
            Kind::Annotation,
            Kind::GpuAnnotation,
            Kind::Python,
            Kind::Overhead,
            Kind::Instant,
            Kind::Other,
        ];
        ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One canonical event, as an adapter hands it over. `rank`, `step` and `op` are filled in
/// later by [`crate::resolve`]; so is `scope`, unless the adapter sets it.
#[derive(Debug, Default, Clone)]
pub struct Event<'a> {
    pub device: Option<i32>,
    pub stream: Option<i64>,
    pub pid: Option<i64>,
    pub tid: Option<i64>,
    pub name: &'a str,
    pub ts: i64,
    pub dur: i64,
    pub correlation: Option<i64>,
    pub bytes: Option<i64>,
    pub copy_kind: Option<&'a str>,
    pub grid: [Option<i32>; 3],
    pub block: [Option<i32>; 3],
    pub registers: Option<i32>,
    pub shared_mem: Option<i64>,
    pub args: Option<&'a str>,
    pub scope: Option<&'a str>,
}

/// Builders for the columns of [`schema::events_schema`].
pub struct EventColumns {
    device: Int32Builder,
    stream: Int64Builder,
    pid: Int64Builder,
    tid: Int64Builder,
    kind: StringDictionaryBuilder<Int32Type>,
    name: StringDictionaryBuilder<Int32Type>,
    ts: Int64Builder,
    dur: Int64Builder,
    correlation: Int64Builder,
    bytes: Int64Builder,
    copy_kind: StringBuilder,
    geometry: [Int32Builder; 6],
    registers: Int32Builder,
    shared_mem: Int64Builder,
    args: StringBuilder,
    scope: StringBuilder,
    len: usize,
}

impl Default for EventColumns {
    fn default() -> Self {
        Self::with_capacity(1024)
    }
}

impl EventColumns {
    pub fn with_capacity(n: usize) -> Self {
        EventColumns {
            device: Int32Builder::with_capacity(n),
            stream: Int64Builder::with_capacity(n),
            pid: Int64Builder::with_capacity(n),
            tid: Int64Builder::with_capacity(n),
            kind: StringDictionaryBuilder::new(),
            name: StringDictionaryBuilder::new(),
            ts: Int64Builder::with_capacity(n),
            dur: Int64Builder::with_capacity(n),
            correlation: Int64Builder::with_capacity(n),
            bytes: Int64Builder::with_capacity(n),
            copy_kind: StringBuilder::new(),
            geometry: std::array::from_fn(|_| Int32Builder::with_capacity(n)),
            registers: Int32Builder::with_capacity(n),
            shared_mem: Int64Builder::with_capacity(n),
            args: StringBuilder::with_capacity(n, n * 64),
            scope: StringBuilder::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, kind: Kind, e: &Event<'_>) {
        self.device.append_option(e.device);
        self.stream.append_option(e.stream);
        self.pid.append_option(e.pid);
        self.tid.append_option(e.tid);
        self.kind.append_value(kind.name());
        self.name.append_value(e.name);
        self.ts.append_value(e.ts);
        self.dur.append_value(e.dur);
        self.correlation.append_option(e.correlation);
        self.bytes.append_option(e.bytes);
        self.copy_kind.append_option(e.copy_kind);
        for (b, v) in self
            .geometry
            .iter_mut()
            .zip(e.grid.iter().chain(e.block.iter()))
        {
            b.append_option(*v);
        }
        self.registers.append_option(e.registers);
        self.shared_mem.append_option(e.shared_mem);
        self.args.append_option(e.args);
        self.scope.append_option(e.scope);
        self.len += 1;
    }

    /// The batch, with `rank`, `step` and `op` null (resolved later).
    pub fn finish(mut self) -> RecordBatch {
        let n = self.len;
        let nulls_i32 =
            || -> ArrayRef { Arc::new(datafusion::arrow::array::Int32Array::new_null(n)) };
        let nulls_i64 =
            || -> ArrayRef { Arc::new(datafusion::arrow::array::Int64Array::new_null(n)) };
        let nulls_str =
            || -> ArrayRef { Arc::new(datafusion::arrow::array::StringArray::new_null(n)) };
        let [gx, gy, gz, bx, by, bz] = &mut self.geometry;
        let columns: Vec<ArrayRef> = vec![
            nulls_i32(),
            nulls_i64(),
            Arc::new(self.device.finish()),
            Arc::new(self.stream.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.tid.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.ts.finish()),
            Arc::new(self.dur.finish()),
            Arc::new(self.correlation.finish()),
            nulls_str(),
            Arc::new(self.scope.finish()),
            Arc::new(self.bytes.finish()),
            Arc::new(self.copy_kind.finish()),
            Arc::new(gx.finish()),
            Arc::new(gy.finish()),
            Arc::new(gz.finish()),
            Arc::new(bx.finish()),
            Arc::new(by.finish()),
            Arc::new(bz.finish()),
            Arc::new(self.registers.finish()),
            Arc::new(self.shared_mem.finish()),
            Arc::new(self.args.finish()),
        ];
        RecordBatch::try_new(TableKind::Events.file_schema(), columns)
            .expect("builders match the events schema")
    }
}

/// Builders for the columns of [`schema::counters_schema`].
#[derive(Default)]
pub struct CounterColumns {
    device: Int32Builder,
    pid: Int64Builder,
    name: StringDictionaryBuilder<Int32Type>,
    ts: Int64Builder,
    value: Float64Builder,
    len: usize,
}

impl CounterColumns {
    pub fn push(&mut self, device: Option<i32>, pid: Option<i64>, name: &str, ts: i64, value: f64) {
        self.device.append_option(device);
        self.pid.append_option(pid);
        self.name.append_value(name);
        self.ts.append_value(ts);
        self.value.append_value(value);
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn finish(mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(datafusion::arrow::array::Int32Array::new_null(self.len)),
            Arc::new(self.device.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.ts.finish()),
            Arc::new(self.value.finish()),
        ];
        RecordBatch::try_new(TableKind::Counters.file_schema(), columns)
            .expect("builders match the counters schema")
    }
}

/// Interns strings into dense ids.
#[derive(Debug, Default)]
pub struct Interner {
    ids: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.names.len() as u32;
        let s: Arc<str> = Arc::from(s);
        self.names.push(s.clone());
        self.ids.insert(s, id);
        id
    }

    pub fn name(&self, id: u32) -> &Arc<str> {
        &self.names[id as usize]
    }

    pub fn names(&self) -> &[Arc<str>] {
        &self.names
    }
}

/// A host interval (an operator or an annotation) on one thread. 24 bytes: a large trace holds
/// millions of these until it is attributed.
#[derive(Debug, Clone, Copy)]
pub struct HostInterval {
    pub start: i64,
    pub end: i64,
    /// Id in [`HostStructure::names`].
    pub name: u32,
    /// Id in [`HostStructure::threads`] shifted left by one; the low bit marks an annotation.
    thread_and_kind: u32,
}

impl HostInterval {
    pub fn new(thread: u32, start: i64, end: i64, name: u32, annotation: bool) -> HostInterval {
        HostInterval {
            start,
            end,
            name,
            thread_and_kind: thread << 1 | annotation as u32,
        }
    }

    pub fn thread(&self) -> u32 {
        self.thread_and_kind >> 1
    }

    pub fn annotation(&self) -> bool {
        self.thread_and_kind & 1 == 1
    }

    /// Sort key: thread, operators before annotations, start, longest first.
    pub fn order_key(&self) -> (u32, i64, std::cmp::Reverse<i64>) {
        (
            self.thread_and_kind,
            self.start,
            std::cmp::Reverse(self.end),
        )
    }
}

/// A launch call: where the GPU work with this correlation id was issued from.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub correlation: i64,
    pub ts: i64,
    /// Id in [`HostStructure::threads`].
    pub thread: u32,
}

/// Dense ids of host threads (pid, tid).
#[derive(Debug, Default)]
pub struct Threads {
    ids: HashMap<(i64, i64), u32>,
    keys: Vec<(i64, i64)>,
}

impl Threads {
    pub fn intern(&mut self, pid: i64, tid: i64) -> u32 {
        let next = self.keys.len() as u32;
        *self.ids.entry((pid, tid)).or_insert_with(|| {
            self.keys.push((pid, tid));
            next
        })
    }

    pub fn get(&self, pid: i64, tid: i64) -> Option<u32> {
        self.ids.get(&(pid, tid)).copied()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn keys(&self) -> &[(i64, i64)] {
        &self.keys
    }
}

/// A profiler step range. `process` is the pid it applies to when correlation ids (and steps)
/// are per process ([`HostStructure::correlation_per_process`]), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Step {
    pub process: i64,
    pub start: i64,
    pub end: i64,
    pub number: i64,
}

/// Host-side structure gathered while parsing; ids refer to its interners.
#[derive(Debug, Default)]
pub struct HostStructure {
    pub names: Interner,
    pub threads: Threads,
    pub intervals: Vec<HostInterval>,
    pub launches: Vec<Launch>,
    /// `(start, end, step number)` of `ProfilerStep#N` ranges.
    pub steps: Vec<Step>,
    /// Earliest start and latest end of any host (non-GPU) event.
    pub host_span: Option<(i64, i64)>,
    /// Correlation ids are unique per process only (Nsight Systems): GPU work is matched to
    /// the launch with the same correlation id *and* the same `pid`.
    pub correlation_per_process: bool,
}

impl HostStructure {
    /// Appends `other`, translating its name and thread ids into this structure's.
    pub fn absorb(&mut self, other: HostStructure) {
        let names: Vec<u32> = other
            .names
            .names()
            .iter()
            .map(|n| self.names.intern(n))
            .collect();
        let threads: Vec<u32> = other
            .threads
            .keys()
            .iter()
            .map(|&(p, t)| self.threads.intern(p, t))
            .collect();
        self.intervals.extend(other.intervals.into_iter().map(|iv| {
            HostInterval::new(
                threads[iv.thread() as usize],
                iv.start,
                iv.end,
                names[iv.name as usize],
                iv.annotation(),
            )
        }));
        self.launches
            .extend(other.launches.into_iter().map(|mut l| {
                l.thread = threads[l.thread as usize];
                l
            }));
        self.steps.extend(other.steps);
        if let Some((lo, hi)) = other.host_span {
            self.extend_host_span(lo, hi);
        }
    }

    pub fn extend_host_span(&mut self, start: i64, end: i64) {
        self.host_span = Some(match self.host_span {
            Some((lo, hi)) => (lo.min(start), hi.max(end)),
            None => (start, end),
        });
    }
}

/// `N` of `ProfilerStep#N`.
pub fn profiler_step_number(name: &str) -> Option<i64> {
    name.strip_prefix("ProfilerStep#")?.parse().ok()
}

// The attribution index is held for a whole trace file: keep its entries small.
const _: () = assert!(std::mem::size_of::<HostInterval>() == 24);
const _: () = assert!(std::mem::size_of::<Launch>() == 24);
