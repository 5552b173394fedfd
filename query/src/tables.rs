//! DataFusion table providers over the manifest.
//!
//! [`ManifestTable`] builds its Parquet scan from the statement's manifest (the version
//! pinned for it, see [`PinnedManifest`], else the newest) on every query, so a long-lived
//! session sees runs committed after it started (DataFusion's `ListingTable` would serve a
//! file list cached forever) while one statement sees one version. Files are pruned with the
//! per-file min/max kept in the manifest before any I/O; row groups and pages are pruned by
//! the Parquet reader. Each file is checked before it is opened: no symbolic link on its
//! path, and the size the manifest records.

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, MapBuilder, RecordBatch, StringArray,
    StringBuilder, TimestampNanosecondArray,
};
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::{Column, DFSchema, ScalarValue, Statistics};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::config::SessionConfig;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown, TableType};
use datafusion::object_store::path::Path as ObjectPath;
use datafusion::object_store::ObjectMeta;
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::physical_expr::expressions::Column as PhysicalColumn;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::ExecutionPlan;
use gpuq_engine::manifest::{FileEntry, Manifest};
use gpuq_engine::run_id::RunId;
use gpuq_engine::schema::{self, TableKind};
use gpuq_engine::store::Store;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Bytes read from the end of a data file to get its footer and page index in one read.
const FOOTER_READ_BYTES: usize = 64 * 1024;

fn df_err(e: gpuq_engine::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The manifest version one statement reads, kept in its session's configuration: every
/// table and table function of the statement reads this version, so that a writer that
/// commits while the statement is planned cannot make `runs` say one thing and `events`
/// another. The query layer pins it when a statement is planned (`gpuq_query::pin`).
#[derive(Debug)]
pub struct PinnedManifest(pub Arc<Manifest>);

/// The manifest a statement planned with `config` reads: the pinned one, else the newest.
pub fn statement_manifest(store: &Store, config: &SessionConfig) -> Result<Arc<Manifest>> {
    match config.get_extension::<PinnedManifest>() {
        Some(pinned) => Ok(pinned.0.clone()),
        None => store.manifest().map_err(df_err),
    }
}

/// `events` or `counters`: every run's files of one table, from the statement's manifest.
#[derive(Debug)]
pub struct ManifestTable {
    store: Store,
    table: TableKind,
    schema: SchemaRef,
}

impl ManifestTable {
    pub fn new(store: Store, table: TableKind) -> ManifestTable {
        ManifestTable {
            store,
            table,
            schema: schema::table_schema(table),
        }
    }
}

/// Per-file statistics for [`PruningPredicate`]s, straight from the manifest.
struct FileStats<'a> {
    files: &'a [(&'a RunId, &'a FileEntry)],
}

impl PruningStatistics for FileStats<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.values(column, |(lo, _)| lo)
    }
    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.values(column, |(_, hi)| hi)
    }
    fn num_containers(&self) -> usize {
        self.files.len()
    }
    fn null_counts(&self, _column: &Column) -> Option<ArrayRef> {
        None
    }
    fn row_counts(&self) -> Option<ArrayRef> {
        Some(Arc::new(
            datafusion::arrow::array::UInt64Array::from_iter_values(
                self.files.iter().map(|(_, f)| f.rows),
            ),
        ))
    }
    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}

impl FileStats<'_> {
    fn values(&self, column: &Column, pick: fn((i64, i64)) -> i64) -> Option<ArrayRef> {
        let name = column.name.as_str();
        if name == "run" {
            return Some(Arc::new(StringArray::from_iter_values(
                self.files.iter().map(|(r, _)| r.as_str()),
            )));
        }
        let values = self
            .files
            .iter()
            .map(|(_, f)| f.stats.get(name).map(|s| s.map(pick)));
        let all: Option<Vec<Option<i64>>> = values.collect();
        let all = all?; // column without manifest stats: cannot prune
        match column_type(name) {
            Some(DataType::Int32) => Some(Arc::new(Int32Array::from_iter(
                all.into_iter().map(|v| v.map(|v| v as i32)),
            ))),
            Some(DataType::Int64) => Some(Arc::new(Int64Array::from_iter(all))),
            _ => None,
        }
    }
}

fn column_type(name: &str) -> Option<DataType> {
    schema::events_schema()
        .field_with_name(name)
        .ok()
        .map(|f| f.data_type().clone())
}

/// Splits files into at least `n` groups of similar total size such that each group holds at
/// most one file of a run, in run order: every file is sorted by the table's sort columns, so
/// each group is then sorted by `(run, sort columns...)` as a whole. Files arrive grouped by
/// run in run order (the manifest's order); a run with more files than `n` gets one group per
/// file.
fn run_ordered_groups(files: Vec<(&RunId, u64, PartitionedFile)>, n: usize) -> Vec<FileGroup> {
    let mut per_run: Vec<Vec<(u64, PartitionedFile)>> = Vec::new();
    let mut last: Option<&RunId> = None;
    for (run, size, f) in files {
        if last != Some(run) {
            per_run.push(Vec::new());
            last = Some(run);
        }
        per_run.last_mut().expect("pushed above").push((size, f));
    }
    let widest = per_run.iter().map(Vec::len).max().unwrap_or(0);
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> =
        (0..n.max(widest).max(1)).map(|_| (0, Vec::new())).collect();
    let mut order: Vec<usize> = (0..groups.len()).collect();
    for mut run_files in per_run {
        run_files.sort_by(|a, b| b.0.cmp(&a.0));
        // The run's largest file into the lightest group, the next into the next lightest, ...
        order.sort_by_key(|&g| groups[g].0);
        for ((size, f), &g) in run_files.into_iter().zip(&order) {
            groups[g].0 += size;
            groups[g].1.push(f);
        }
    }
    groups
        .into_iter()
        .filter(|g| !g.1.is_empty())
        .map(|g| FileGroup::new(g.1))
        .collect()
}

/// The manifest's min/max of a file as DataFusion statistics (inexact, so never used to
/// answer a query), for the file schema's columns. DataFusion checks a declared ordering of a
/// group of several files against these; a column that is null in every row gets NULL bounds,
/// which sort first, as the files do.
fn file_statistics(file_schema: &Schema, f: &FileEntry) -> Statistics {
    let mut stats = Statistics::new_unknown(file_schema);
    stats.num_rows = Precision::Exact(f.rows as usize);
    stats.total_byte_size = Precision::Inexact(f.size as usize);
    for (field, column) in file_schema
        .fields()
        .iter()
        .zip(&mut stats.column_statistics)
    {
        let Some(minmax) = f.stats.get(field.name()) else {
            continue;
        };
        let scalar = |v: Option<i64>| match field.data_type() {
            DataType::Int32 => Some(ScalarValue::Int32(v.map(|v| v as i32))),
            DataType::Int64 => Some(ScalarValue::Int64(v)),
            _ => None,
        };
        if let (Some(lo), Some(hi)) = (scalar(minmax.map(|m| m.0)), scalar(minmax.map(|m| m.1))) {
            column.min_value = Precision::Inexact(lo);
            column.max_value = Precision::Inexact(hi);
        }
    }
    stats
}

/// Whether a filter references a column that row-group statistics or the page index can
/// prune on: the table's sort columns, and `step` and `correlation`, which grow with `ts`.
fn prunes_inside_files(table: TableKind, filters: &[Expr]) -> bool {
    filters.iter().any(|f| {
        f.column_refs().iter().any(|c| {
            let name = c.name.as_str();
            table.sort_columns().contains(&name) || matches!(name, "step" | "correlation")
        })
    })
}

/// The kinds a filter admits, when it restricts the `kind` column to a set of constants
/// (`kind = 'kernel'`, `kind IN ('runtime', 'driver')`, or an OR of such); `None` otherwise.
fn admitted_kinds(filter: &Expr) -> Option<Vec<String>> {
    fn kind_column(e: &Expr) -> bool {
        match e {
            Expr::Column(c) => c.name == "kind",
            Expr::Cast(c) => kind_column(&c.expr),
            Expr::TryCast(c) => kind_column(&c.expr),
            _ => false,
        }
    }
    fn text(e: &Expr) -> Option<String> {
        match e {
            Expr::Literal(v, _) => match v {
                ScalarValue::Dictionary(_, v) => text(&Expr::Literal((**v).clone(), None)),
                ScalarValue::Utf8(Some(t))
                | ScalarValue::Utf8View(Some(t))
                | ScalarValue::LargeUtf8(Some(t)) => Some(t.clone()),
                _ => None,
            },
            Expr::Cast(c) => text(&c.expr),
            Expr::TryCast(c) => text(&c.expr),
            _ => None,
        }
    }
    match filter {
        Expr::BinaryExpr(b) if b.op == Operator::Eq => {
            if kind_column(&b.left) {
                text(&b.right).map(|k| vec![k])
            } else if kind_column(&b.right) {
                text(&b.left).map(|k| vec![k])
            } else {
                None
            }
        }
        Expr::BinaryExpr(b) if b.op == Operator::Or => {
            let mut kinds = admitted_kinds(&b.left)?;
            kinds.extend(admitted_kinds(&b.right)?);
            Some(kinds)
        }
        Expr::InList(l) if !l.negated && kind_column(&l.expr) => l.list.iter().map(text).collect(),
        _ => None,
    }
}

/// The rows of `f` that can hold one of `kinds`, from the manifest's kind ranges: `None` when
/// the file has no ranges recorded (read every row), else the merged ranges (empty: no row
/// can match).
fn kind_rows(f: &FileEntry, kinds: &[String]) -> Option<Vec<(u64, u64)>> {
    if f.kinds.is_empty() {
        return None;
    }
    let mut ranges: Vec<(u64, u64)> = kinds
        .iter()
        .filter_map(|k| f.kinds.get(k))
        .flatten()
        .copied()
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi.min(f.rows))),
        }
    }
    Some(merged)
}

/// A Parquet row selection of `ranges` in a file of `rows` rows.
fn row_selection(ranges: &[(u64, u64)], rows: u64) -> ParquetRowSelection {
    let mut selectors = Vec::with_capacity(2 * ranges.len() + 1);
    let mut at = 0;
    for &(lo, hi) in ranges {
        if lo > at {
            selectors.push(RowSelector::skip((lo - at) as usize));
        }
        selectors.push(RowSelector::select((hi - lo) as usize));
        at = hi;
    }
    if rows > at {
        selectors.push(RowSelector::skip((rows - at) as usize));
    }
    ParquetRowSelection::new(RowSelection::from(selectors))
}

/// The order of the rows of each file group: `run`, then the table's sort columns, ascending
/// with nulls first (as `part::sort_batches` writes them).
fn group_ordering(table: TableKind, table_schema: &Schema) -> Result<Vec<LexOrdering>> {
    let first = SortOptions {
        descending: false,
        nulls_first: true,
    };
    let keys = std::iter::once("run")
        .chain(table.sort_columns().iter().copied())
        .map(|name| -> Result<PhysicalSortExpr> {
            let index = table_schema.index_of(name)?;
            Ok(PhysicalSortExpr::new(
                Arc::new(PhysicalColumn::new(name, index)),
                first,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(LexOrdering::new(keys).into_iter().collect())
}

#[async_trait]
impl TableProvider for ManifestTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let manifest = statement_manifest(&self.store, state.config())?;
        let mut files: Vec<(&RunId, &FileEntry)> = manifest.files(self.table).collect();
        // Rows of the admitted kinds only, by the manifest's kind ranges; files without any
        // such row are not read at all.
        let kinds = filters.iter().find_map(admitted_kinds);
        let mut selections: HashMap<&str, ParquetRowSelection> = HashMap::new();
        if let Some(kinds) = &kinds {
            files.retain(|(_, f)| match kind_rows(f, kinds) {
                None => true,
                Some(ranges) if ranges.is_empty() => false,
                Some(ranges) => {
                    if ranges != [(0, f.rows)] {
                        selections.insert(f.path.as_str(), row_selection(&ranges, f.rows));
                    }
                    true
                }
            });
        }
        if let Some(predicate) = conjunction(filters.iter().cloned()) {
            let df_schema = DFSchema::try_from(self.schema.clone())?;
            let physical = state.create_physical_expr(predicate, &df_schema)?;
            if let Some(pruning) = PruningPredicateBuilder::new()
                .with_file_schema(self.schema.clone())
                .build(physical)
            {
                let keep = pruning.prune(&FileStats { files: &files })?;
                let mut keep = keep.into_iter();
                files.retain(|_| keep.next().unwrap_or(true));
            }
        }
        let file_schema = self.table.file_schema();
        let n_file_cols = file_schema.fields().len();
        if files.is_empty() {
            let projected = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => self.schema.clone(),
            };
            return Ok(Arc::new(EmptyExec::new(projected)));
        }
        // SQL sees `run` first; the scan has it after the file columns.
        let to_scan = |i: usize| if i == 0 { n_file_cols } else { i - 1 };
        let mapped: Vec<usize> = match projection {
            Some(p) => p.iter().map(|&i| to_scan(i)).collect(),
            None => (0..self.schema.fields().len()).map(to_scan).collect(),
        };
        let partitioned = files
            .iter()
            .map(|&(run, f)| {
                // Checked before its size is used: a crafted size would size the reads.
                let abs = self.store.checked_file_path(&manifest, f).map_err(df_err)?;
                let location = ObjectPath::from_absolute_path(&abs)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let meta = ObjectMeta {
                    location,
                    last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
                    size: f.size,
                    e_tag: None,
                    version: None,
                };
                let mut pf = PartitionedFile::new_from_meta(meta)
                    .with_partition_values(vec![ScalarValue::Utf8(Some(run.to_string()))])
                    .with_statistics(Arc::new(file_statistics(&file_schema, f)));
                if let Some(selection) = selections.remove(f.path.as_str()) {
                    pf = pf.with_extension(selection);
                }
                Ok((run, f.size, pf))
            })
            .collect::<Result<Vec<_>>>()?;
        let groups = run_ordered_groups(partitioned, state.config().target_partitions());
        let table_schema = TableSchema::builder(file_schema.clone())
            .with_table_partition_cols(vec![Arc::new(schema::run_field())])
            .build();
        let mut scan_schema = file_schema.fields().to_vec();
        scan_schema.push(Arc::new(schema::run_field()));
        let ordering = group_ordering(self.table, &Schema::new(scan_schema))?;
        let mut options = state.table_options().parquet.clone();
        // DataFusion's default first read of a file is its last 512 KiB, to catch footer and
        // page index in one go; ours need far less (about 8 KiB of footer plus the page
        // index), and a one-shot query over 500 runs would otherwise read 256 MB of tails.
        options.global.metadata_size_hint = Some(FOOTER_READ_BYTES);
        if !prunes_inside_files(self.table, filters) {
            // Row-group statistics and the page index only pay off for filters on the columns
            // rows are ordered by; for the rest (a kind, a run, no filter) they cost every
            // file a page-index read and a pruning pass that keeps everything (a GROUP BY over
            // 500 runs: 0.42 s with them, 0.35 s without).
            options.global.pruning = false;
            options.global.enable_page_index = false;
        }
        let format = ParquetFormat::default().with_options(options);
        let source = format.file_source(table_schema);
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), source)
            .with_file_groups(groups)
            .with_output_ordering(ordering)
            .with_projection_indices(Some(mapped))?
            .with_limit(limit)
            .build();
        format.create_physical_plan(state, config).await
    }
}

/// The `runs` table: one row per run of the statement's manifest.
#[derive(Debug)]
pub struct RunsTable {
    store: Store,
}

impl RunsTable {
    pub fn new(store: Store) -> RunsTable {
        RunsTable { store }
    }

    pub fn table_schema() -> SchemaRef {
        let utf8 = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
        let i64f = |n: &str| Field::new(n, DataType::Int64, true);
        let map_field = Field::new_map(
            "tags",
            "entries",
            Field::new("keys", DataType::Utf8, false),
            Field::new("values", DataType::Utf8, true),
            false,
            false,
        );
        Arc::new(Schema::new(vec![
            utf8("run", false),
            utf8("format", false),
            Field::new(
                "imported_at",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Field::new("ranks", DataType::Int32, false),
            i64f("world_size"),
            utf8("gpus", true),
            i64f("first_ts"),
            i64f("last_ts"),
            i64f("span"),
            i64f("events"),
            i64f("kernels"),
            i64f("files"),
            i64f("stored_bytes"),
            i64f("warnings"),
            map_field,
            utf8("sources", false),
            utf8("devices", false),
            utf8("metadata", true),
            utf8("warning_details", true),
            utf8("open_stages", true),
        ]))
    }

    /// The whole table as one batch.
    pub fn batch(manifest: &Manifest) -> Result<RecordBatch> {
        let runs: Vec<_> = manifest.runs.iter().collect();
        let s = |f: &dyn Fn(&gpuq_engine::manifest::RunEntry) -> Option<String>| -> ArrayRef {
            Arc::new(StringArray::from(
                runs.iter().map(|(_, e)| f(e)).collect::<Vec<_>>(),
            ))
        };
        let i = |f: &dyn Fn(&gpuq_engine::manifest::RunEntry) -> Option<i64>| -> ArrayRef {
            Arc::new(Int64Array::from(
                runs.iter().map(|(_, e)| f(e)).collect::<Vec<_>>(),
            ))
        };
        let mut tags = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        for (_, e) in &runs {
            for (k, v) in &e.meta.tags {
                tags.keys().append_value(k);
                tags.values().append_value(v);
            }
            tags.append(true)?;
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                runs.iter().map(|(r, _)| r.as_str()),
            )),
            s(&|e| Some(e.meta.format.clone())),
            Arc::new(
                TimestampNanosecondArray::from(
                    runs.iter()
                        .map(|(_, e)| e.meta.imported_at_ns)
                        .collect::<Vec<_>>(),
                )
                .with_timezone("UTC"),
            ),
            Arc::new(Int32Array::from(
                runs.iter()
                    .map(|(_, e)| e.meta.ranks.len().max(1) as i32)
                    .collect::<Vec<_>>(),
            )),
            i(&|e| e.meta.world_size),
            s(&|e| gpu_summary(&e.meta.devices)),
            i(&|e| e.meta.first_ts),
            i(&|e| e.meta.last_ts),
            i(&|e| Some(e.meta.last_ts? - e.meta.first_ts?)),
            i(&|e| Some(e.meta.events as i64)),
            i(&|e| Some(e.meta.kernels as i64)),
            i(&|e| Some(e.files.len() as i64)),
            i(&|e| Some(e.files.iter().map(|f| f.size as i64).sum())),
            i(&|e| Some(e.meta.warnings.values().sum::<u64>() as i64)),
            Arc::new(tags.finish()),
            s(&|e| json(&e.meta.sources)),
            s(&|e| json(&e.meta.devices)),
            s(&|e| json(&e.meta.metadata)),
            s(&|e| {
                if e.meta.warnings.is_empty() {
                    None
                } else {
                    json(&e.meta.warnings)
                }
            }),
            s(&|e| {
                if e.meta.open_stages.is_empty() {
                    None
                } else {
                    json(&e.meta.open_stages)
                }
            }),
        ];
        // The map builder names its fields itself; cast to the declared schema's names.
        let schema = Self::table_schema();
        let columns = columns
            .into_iter()
            .zip(schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    datafusion::arrow::compute::cast(&c, f.data_type())
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(schema, columns)?)
    }
}

/// `"8x NVIDIA A100-SXM4-80GB"`, or several such parts joined by `, `.
fn gpu_summary(devices: &[gpuq_engine::manifest::DeviceInfo]) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for d in devices {
        let name = if d.name.is_empty() {
            "unnamed GPU".to_string()
        } else {
            d.name.clone()
        };
        match counts.iter_mut().find(|c| c.0 == name) {
            Some(c) => c.1 += 1,
            None => counts.push((name, 1)),
        }
    }
    if counts.is_empty() {
        return None;
    }
    Some(
        counts
            .iter()
            .map(|(n, c)| format!("{c}x {n}"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// Compact JSON text of a manifest value.
fn json<T: serde::Serialize>(v: &T) -> Option<String> {
    serde_json::to_string(v).ok()
}

#[async_trait]
impl TableProvider for RunsTable {
    fn schema(&self) -> SchemaRef {
        Self::table_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let manifest = statement_manifest(&self.store, state.config())?;
        let batch = Self::batch(&manifest)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            Self::table_schema(),
            projection.cloned(),
        )?)
    }
}
