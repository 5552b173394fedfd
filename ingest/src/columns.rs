//! Columnar builders for canonical events and counters, the event kinds, and the limits on
//! what one event may hold. The host-side structure read for attribution is
//! [`crate::attribute::host`]'s.

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
/// later by [`crate::attribute`]; so is `scope`, unless the adapter sets it.
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
