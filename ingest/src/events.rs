//! Columnar builders for canonical events and counters, and the host-side structure
//! (operators, annotations, launches, steps) used to attribute GPU work to the model.

use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, DictionaryArray, Float64Builder, Int32Array,
    Int32Builder, Int64Array, Int64Builder, PrimitiveBuilder, RecordBatch, StringArray,
    StringBuilder, StringDictionaryBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Int32Type, Int64Type};
use gpuq_engine::schema::{self, TableKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Rows of the shared all-null arrays [`null_column`] slices: more than a parse task's batch.
const SHARED_NULL_ROWS: usize = 1 << 16;

/// An all-null column of `len` rows. Most columns of a parsed batch are null in every row (a
/// host batch has no device, stream, geometry, bytes; `rank`, `step` and `op` come later), in
/// every batch and again when a spool frame is decoded: up to [`SHARED_NULL_ROWS`] rows they
/// are slices of one array per type, instead of zeroed buffers allocated for each batch.
pub(crate) fn null_column(data_type: &DataType, len: usize) -> ArrayRef {
    static SHARED: Mutex<Vec<ArrayRef>> = Mutex::new(Vec::new());
    if len > SHARED_NULL_ROWS {
        return new_null_array(data_type, len);
    }
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    let array = match shared.iter().find(|a| a.data_type() == data_type) {
        Some(a) => a.clone(),
        None => {
            let a = new_null_array(data_type, SHARED_NULL_ROWS);
            shared.push(a.clone());
            a
        }
    };
    drop(shared);
    array.slice(0, len)
}

/// The longest event name stored, in bytes. The longest real names (C++ template kernels)
/// are tens of KB; past this a name is damage or an attack, refused as bad input before it
/// costs memory and time downstream.
pub const MAX_NAME_BYTES: usize = 1 << 20;

/// The longest `args` text stored, in bytes: room for call stacks and input shapes of real
/// traces (a few KB at most), far below Arrow's 2 GiB per string array.
pub const MAX_ARGS_BYTES: usize = 16 << 20;

/// Why an event's name or `args` is refused, if it is: longer than [`MAX_NAME_BYTES`] or
/// [`MAX_ARGS_BYTES`].
pub fn oversized(name_bytes: usize, args_bytes: usize) -> Option<String> {
    let mib = |n: usize| n as f64 / (1 << 20) as f64;
    if name_bytes > MAX_NAME_BYTES {
        return Some(format!(
            "an event name of {:.1} MiB; names are limited to {} MiB",
            mib(name_bytes),
            MAX_NAME_BYTES >> 20
        ));
    }
    (args_bytes > MAX_ARGS_BYTES).then(|| {
        format!(
            "an args text of {:.1} MiB; args are limited to {} MiB",
            mib(args_bytes),
            MAX_ARGS_BYTES >> 20
        )
    })
}

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

/// A nullable column that stays unallocated while every value is null: a batch of host events
/// has no device, stream, geometry or bytes, and skips their per-row work.
struct Lazy<B> {
    builder: Option<B>,
    len: usize,
    /// Room to start the builder with: rows, and bytes of text (growing a builder row by row
    /// reallocates and copies its buffers, 1.4 % of a Kineto ingest's CPU for `args`).
    room: (usize, usize),
}

type LazyPrimitive<T> = Lazy<PrimitiveBuilder<T>>;
type LazyString = Lazy<StringBuilder>;

/// The builders a [`Lazy`] column can start on its first value.
trait LazyBuilder: Sized {
    type Value<'a>;
    /// A builder with room for `rows` rows (and `bytes` bytes of text).
    fn with_room(rows: usize, bytes: usize) -> Self;
    fn append_nulls(&mut self, n: usize);
    fn append_option(&mut self, v: Option<Self::Value<'_>>);
    fn finish(&mut self) -> ArrayRef;
    fn nulls(len: usize) -> ArrayRef;
}

impl<T: ArrowPrimitiveType> LazyBuilder for PrimitiveBuilder<T> {
    type Value<'a> = T::Native;
    fn with_room(rows: usize, _bytes: usize) -> Self {
        PrimitiveBuilder::with_capacity(rows)
    }
    fn append_nulls(&mut self, n: usize) {
        PrimitiveBuilder::append_nulls(self, n)
    }
    fn append_option(&mut self, v: Option<T::Native>) {
        PrimitiveBuilder::append_option(self, v)
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(PrimitiveBuilder::finish(self))
    }
    fn nulls(len: usize) -> ArrayRef {
        null_column(&T::DATA_TYPE, len)
    }
}

impl LazyBuilder for StringBuilder {
    type Value<'a> = &'a str;
    fn with_room(rows: usize, bytes: usize) -> Self {
        StringBuilder::with_capacity(rows, bytes)
    }
    fn append_nulls(&mut self, n: usize) {
        StringBuilder::append_nulls(self, n)
    }
    fn append_option(&mut self, v: Option<&str>) {
        StringBuilder::append_option(self, v)
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(StringBuilder::finish(self))
    }
    fn nulls(len: usize) -> ArrayRef {
        null_column(&DataType::Utf8, len)
    }
}

impl<B: LazyBuilder> Lazy<B> {
    /// A column expected to hold about `rows` rows, and `bytes` bytes of text.
    fn with_room(rows: usize, bytes: usize) -> Self {
        Lazy {
            builder: None,
            len: 0,
            room: (rows, bytes),
        }
    }

    #[inline]
    fn push(&mut self, v: Option<B::Value<'_>>) {
        match (&mut self.builder, v) {
            (Some(b), v) => b.append_option(v),
            (None, None) => {}
            (None, v @ Some(_)) => {
                let rows = self.room.0.max(self.len.max(1024) * 2);
                let mut b = B::with_room(rows, self.room.1.max(rows * 32));
                b.append_nulls(self.len);
                b.append_option(v);
                self.builder = Some(b);
            }
        }
        self.len += 1;
    }

    fn finish(self) -> ArrayRef {
        match self.builder {
            Some(mut b) => b.finish(),
            None => B::nulls(self.len),
        }
    }
}

/// A dictionary-encoded text column. Values are found by their text, or, for adapters whose
/// strings have stable ids (an nsys `StringIds` id), by that id without hashing the text.
#[derive(Default)]
struct DictColumn {
    keys: Vec<i32>,
    values: Vec<Box<str>>,
    by_text: HashMap<Box<str>, i32, ahash::RandomState>,
    by_id: HashMap<u64, i32, ahash::RandomState>,
}

impl DictColumn {
    #[inline]
    fn key_of(&mut self, s: &str) -> i32 {
        if let Some(&k) = self.by_text.get(s) {
            return k;
        }
        let k = self.values.len() as i32;
        self.values.push(s.into());
        self.by_text.insert(s.into(), k);
        k
    }

    #[inline]
    fn push(&mut self, s: &str) {
        let k = self.key_of(s);
        self.keys.push(k);
    }

    /// Appends `s`, known by the caller as `id` (the same id must always mean the same text).
    #[inline]
    fn push_with_id(&mut self, id: u64, s: &str) {
        let k = match self.by_id.get(&id) {
            Some(&k) => k,
            None => {
                let k = self.key_of(s);
                self.by_id.insert(id, k);
                k
            }
        };
        self.keys.push(k);
    }

    fn finish(self) -> ArrayRef {
        let values = StringArray::from_iter_values(self.values.iter().map(|v| &**v));
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(Int32Array::from(self.keys), Arc::new(values))
                .expect("keys index the values"),
        )
    }
}

/// A text column as a dictionary; one null in every row stays a plain null column.
fn dictionary(column: ArrayRef) -> ArrayRef {
    if column.null_count() == column.len() {
        return null_column(&schema::dictionary_type(), column.len());
    }
    cast(&column, &schema::dictionary_type()).expect("text casts to a dictionary")
}

/// Builders for the columns of [`schema::events_schema`].
pub struct EventColumns {
    device: LazyPrimitive<Int32Type>,
    stream: LazyPrimitive<Int64Type>,
    pid: LazyPrimitive<Int64Type>,
    tid: LazyPrimitive<Int64Type>,
    /// Index into [`schema::KINDS`], the dictionary of every batch.
    kind: Vec<i32>,
    name: DictColumn,
    ts: Vec<i64>,
    dur: Vec<i64>,
    correlation: LazyPrimitive<Int64Type>,
    bytes: LazyPrimitive<Int64Type>,
    copy_kind: LazyString,
    geometry: [LazyPrimitive<Int32Type>; 6],
    registers: LazyPrimitive<Int32Type>,
    shared_mem: LazyPrimitive<Int64Type>,
    args: LazyString,
    scope: LazyString,
}

impl Default for EventColumns {
    fn default() -> Self {
        Self::with_capacity(1024)
    }
}

impl EventColumns {
    pub fn with_capacity(n: usize) -> Self {
        Self::with_room(n, 0)
    }

    /// Room for `n` events whose `args` take about `args_bytes` bytes in all.
    pub fn with_room(n: usize, args_bytes: usize) -> Self {
        EventColumns {
            device: Lazy::with_room(n, 0),
            stream: Lazy::with_room(n, 0),
            pid: Lazy::with_room(n, 0),
            tid: Lazy::with_room(n, 0),
            kind: Vec::with_capacity(n),
            name: DictColumn::default(),
            ts: Vec::with_capacity(n),
            dur: Vec::with_capacity(n),
            correlation: Lazy::with_room(n, 0),
            bytes: Lazy::with_room(n, 0),
            copy_kind: Lazy::with_room(n, 0),
            geometry: std::array::from_fn(|_| Lazy::with_room(n, 0)),
            registers: Lazy::with_room(n, 0),
            shared_mem: Lazy::with_room(n, 0),
            args: Lazy::with_room(n, args_bytes),
            scope: Lazy::with_room(n, 0),
        }
    }

    pub fn len(&self) -> usize {
        self.ts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    pub fn push(&mut self, kind: Kind, e: &Event<'_>) {
        self.name.push(e.name);
        self.push_rest(kind, e);
    }

    /// [`Self::push`] for an event whose name the adapter knows by a stable `name_id`.
    pub fn push_with_name_id(&mut self, kind: Kind, e: &Event<'_>, name_id: u64) {
        self.name.push_with_id(name_id, e.name);
        self.push_rest(kind, e);
    }

    #[inline]
    fn push_rest(&mut self, kind: Kind, e: &Event<'_>) {
        self.device.push(e.device);
        self.stream.push(e.stream);
        self.pid.push(e.pid);
        self.tid.push(e.tid);
        self.kind.push(kind as i32);
        self.ts.push(e.ts);
        self.dur.push(e.dur);
        self.correlation.push(e.correlation);
        self.bytes.push(e.bytes);
        self.copy_kind.push(e.copy_kind);
        for (b, v) in self
            .geometry
            .iter_mut()
            .zip(e.grid.iter().chain(e.block.iter()))
        {
            b.push(*v);
        }
        self.registers.push(e.registers);
        self.shared_mem.push(e.shared_mem);
        self.args.push(e.args);
        self.scope.push(e.scope);
    }

    /// The batch, with `rank`, `step` and `op` null (resolved later).
    pub fn finish(self) -> RecordBatch {
        let n = self.len();
        let [gx, gy, gz, bx, by, bz] = self.geometry;
        let kinds = StringArray::from_iter_values(schema::KINDS.iter());
        let kind =
            DictionaryArray::<Int32Type>::try_new(Int32Array::from(self.kind), Arc::new(kinds))
                .expect("kind codes index KINDS");
        let columns: Vec<ArrayRef> = vec![
            null_column(&DataType::Int32, n),
            null_column(&DataType::Int64, n),
            self.device.finish(),
            self.stream.finish(),
            self.pid.finish(),
            self.tid.finish(),
            Arc::new(kind),
            self.name.finish(),
            Arc::new(Int64Array::from(self.ts)),
            Arc::new(Int64Array::from(self.dur)),
            self.correlation.finish(),
            null_column(&schema::dictionary_type(), n),
            dictionary(self.scope.finish()),
            self.bytes.finish(),
            self.copy_kind.finish(),
            gx.finish(),
            gy.finish(),
            gz.finish(),
            bx.finish(),
            by.finish(),
            bz.finish(),
            self.registers.finish(),
            self.shared_mem.finish(),
            self.args.finish(),
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
            null_column(&DataType::Int32, self.len),
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
    ids: HashMap<Arc<str>, u32, ahash::RandomState>,
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

impl Launch {
    pub fn new(correlation: i64, ts: i64, thread: u32) -> Launch {
        Launch {
            correlation,
            ts,
            thread,
        }
    }
}

/// A batch's `kind` column and the kind of each of its dictionary values (None for a name
/// that is no kind).
pub fn kinds_of(batch: &RecordBatch) -> (&DictionaryArray<Int32Type>, Vec<Option<Kind>>) {
    let kinds = batch
        .column_by_name("kind")
        .expect("events column")
        .as_dictionary::<Int32Type>();
    let values = kinds
        .values()
        .as_string::<i32>()
        .iter()
        .map(|v| v.and_then(Kind::from_name))
        .collect();
    (kinds, values)
}

/// Dense ids of host threads (pid, tid).
#[derive(Debug, Default, Clone)]
pub struct Threads {
    ids: HashMap<(i64, i64), u32, ahash::RandomState>,
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
    /// Launch calls that no row holds (the tails of legacy `export_chrome_trace` flow arrows):
    /// kept when the other ranges and launches are left to be found again in the rows, a
    /// window at a time. One per kernel of such a trace, 24 bytes each.
    pub unstored_launches: Vec<Launch>,
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
        let translate = |mut l: Launch| {
            l.thread = threads[l.thread as usize];
            l
        };
        self.launches
            .extend(other.launches.into_iter().map(translate));
        self.unstored_launches
            .extend(other.unstored_launches.into_iter().map(translate));
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

/// How an adapter reads host ranges from its rows ([`host_structure`]).
#[derive(Clone)]
pub struct RangeRules {
    /// Shortest duration of a range: rows that last less contain no time of theirs.
    pub min_dur: i64,
    /// Whether a range needs its row's pid and tid; else a missing one counts as 0.
    pub needs_thread: bool,
    /// A range's name and whether it is an annotation, from its kind (`CpuOp` or
    /// `Annotation`), the row's name and [`RangeRules::step_pattern`].
    pub name: for<'a> fn(Kind, &'a str, Option<&regex::Regex>) -> (&'a str, bool),
    /// The pattern the trace's steps were found by (`--step-pattern`), if not the adapter's
    /// default: a range that marks a step is a scope, never an operator.
    pub step_pattern: Option<regex::Regex>,
}

/// Adds the host ranges (operator and annotation rows lasting at least `rules.min_dur`) and
/// the launch calls (runtime and driver rows with a correlation id, a pid and a tid) among
/// the rows of `batch` to `host`, whose names and threads they are interned in. Steps are not
/// added. Used where attribution reads ranges from spooled rows, a time window at a time.
pub fn host_structure(batch: &RecordBatch, host: &mut HostStructure, rules: &RangeRules) {
    let col = |name: &str| batch.column_by_name(name).expect("events column");
    let (kinds, kind_values) = kinds_of(batch);
    let names = col("name").as_dictionary::<Int32Type>();
    let name_values = names.values().as_string::<i32>();
    // Per name, for an operator row and for an annotation row: its range name's id, and
    // whether that is an annotation.
    let mut name_ids: Vec<[Option<(u32, bool)>; 2]> = vec![[None; 2]; name_values.len()];
    let pid = col("pid").as_primitive::<Int64Type>();
    let tid = col("tid").as_primitive::<Int64Type>();
    let ts = col("ts").as_primitive::<Int64Type>();
    let dur = col("dur").as_primitive::<Int64Type>();
    let corr = col("correlation").as_primitive::<Int64Type>();
    // Rows come in runs of one thread: its id is looked up once per run.
    let mut last_thread: Option<((i64, i64), u32)> = None;
    let mut thread_of = |threads: &mut Threads, key: (i64, i64)| match last_thread {
        Some((k, id)) if k == key => id,
        _ => {
            let id = threads.intern(key.0, key.1);
            last_thread = Some((key, id));
            id
        }
    };
    let has_thread = |i: usize| pid.is_valid(i) && tid.is_valid(i);
    let value = |a: &Int64Array, i: usize| if a.is_valid(i) { a.value(i) } else { 0 };
    for i in 0..batch.num_rows() {
        let Some(kind) = kind_values[kinds.keys().value(i) as usize] else {
            continue;
        };
        if kind.is_launch() {
            if corr.is_valid(i) && has_thread(i) {
                let thread = thread_of(&mut host.threads, (pid.value(i), tid.value(i)));
                host.launches
                    .push(Launch::new(corr.value(i), ts.value(i), thread));
            }
            continue;
        }
        let is_range = matches!(kind, Kind::CpuOp | Kind::Annotation)
            && dur.value(i) >= rules.min_dur
            && (has_thread(i) || !rules.needs_thread);
        if !is_range {
            continue;
        }
        let key = names.keys().value(i) as usize;
        let (name, annotation) = *name_ids[key][(kind == Kind::Annotation) as usize]
            .get_or_insert_with(|| {
                let (name, annotation) =
                    (rules.name)(kind, name_values.value(key), rules.step_pattern.as_ref());
                (host.names.intern(name), annotation)
            });
        let thread = thread_of(&mut host.threads, (value(pid, i), value(tid, i)));
        let start = ts.value(i);
        host.intervals.push(HostInterval::new(
            thread,
            start,
            start + dur.value(i),
            name,
            annotation,
        ));
    }
}

/// `N` of `ProfilerStep#N`.
pub fn profiler_step_number(name: &str) -> Option<i64> {
    name.strip_prefix("ProfilerStep#")?.parse().ok()
}

// The attribution index is held for a whole trace file: keep its entries small.
const _: () = assert!(std::mem::size_of::<HostInterval>() == 24);
const _: () = assert!(std::mem::size_of::<Launch>() == 24);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_columns_are_all_null_of_the_asked_type_and_length_and_share_their_buffers() {
        let types = [
            DataType::Int32,
            DataType::Int64,
            DataType::Utf8,
            schema::dictionary_type(),
        ];
        for data_type in &types {
            for len in [0, 1, 7, 12_345, SHARED_NULL_ROWS, SHARED_NULL_ROWS + 1] {
                let column = null_column(data_type, len);
                assert_eq!(column.data_type(), data_type);
                assert_eq!(column.len(), len);
                assert_eq!(column.logical_null_count(), len, "{data_type} x {len}");
            }
        }
        // Up to the shared length, slices of one array: no buffer of their own.
        let (a, b) = (
            null_column(&DataType::Int64, 10),
            null_column(&DataType::Int64, 20),
        );
        let values = |c: &ArrayRef| c.as_primitive::<Int64Type>().values().inner().as_ptr();
        assert_eq!(values(&a), values(&b));
        let long = null_column(&DataType::Int64, SHARED_NULL_ROWS + 1);
        assert_ne!(values(&long), values(&a));
    }
}
