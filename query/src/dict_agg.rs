//! Partial aggregation by dictionary code: `GROUP BY run, name` without hashing strings per row.
//!
//! DataFusion groups dictionary-encoded keys (`name`, `kind`) through its row-format group
//! values: every row's name (100–200 characters for a kernel) is copied into a row and hashed.
//! The Parquet reader hands `name` over as a dictionary whose values are shared by all batches of
//! a row group, and `run` as a constant per file. So [`DictionaryAggregateRule`] replaces a
//! partial `AggregateExec` whose group keys are such columns and whose aggregates are `sum`,
//! `count`, `min` or `max` of integers by [`DictionaryPartialAggregateExec`]: per batch it maps
//! each dictionary code that occurs to a group once, then adds every row into plain vectors by
//! code. Its output is exactly the partial aggregate's (same schema and state columns, sorted
//! by the same output ordering), so the final aggregate above it is unchanged.

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanBufferBuilder, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::min_max::{Max, Min};
use datafusion::functions_aggregate::sum::Sum;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::sorts::sort::sort_batch;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Replaces eligible partial aggregates by [`DictionaryPartialAggregateExec`].
#[derive(Debug, Default)]
pub struct DictionaryAggregateRule;

impl PhysicalOptimizerRule for DictionaryAggregateRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(agg) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            match DictionaryPartialAggregateExec::try_new(agg)? {
                Some(e) => Ok(Transformed::yes(Arc::new(e) as Arc<dyn ExecutionPlan>)),
                None => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "dictionary_partial_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// What one aggregate computes, and from which argument.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Sum,
    /// `count(*)`: every row.
    CountRows,
    /// `count(col)`: rows where the argument is not null.
    Count,
    Min,
    Max,
}

#[derive(Debug, Clone)]
struct Aggregate {
    op: Op,
    arg: Option<Arc<dyn PhysicalExpr>>,
}

/// A partial `AggregateExec` computed by dictionary code; see the module documentation.
#[derive(Debug)]
pub struct DictionaryPartialAggregateExec {
    /// The replaced node: its schema, expressions and properties are this node's.
    agg: Arc<AggregateExec>,
    input: Arc<dyn ExecutionPlan>,
    /// Input column of each group key.
    keys: Arc<[usize]>,
    aggregates: Arc<[Aggregate]>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

fn is_string_dictionary(dt: &DataType) -> bool {
    matches!(dt, DataType::Dictionary(k, v) if k.is_dictionary_key_type() && **v == DataType::Utf8)
}

impl DictionaryPartialAggregateExec {
    /// The replacement of `agg`, `None` when it is not eligible: partial mode, no limit or
    /// dynamic filter, plain group columns (non-null `Utf8` or `Dictionary(_, Utf8)`, at least
    /// one dictionary), and only `sum`/`count`/`min`/`max` of `Int64` without DISTINCT, FILTER
    /// or ORDER BY.
    pub fn try_new(agg: &AggregateExec) -> Result<Option<Self>> {
        if *agg.mode() != AggregateMode::Partial
            || agg.limit_options().is_some()
            || !agg.dynamic_expressions_produced().is_empty()
            || agg.filter_expr().iter().any(Option::is_some)
        {
            return Ok(None);
        }
        let group = agg.group_expr();
        if group.has_grouping_set() || group.is_empty() {
            return Ok(None);
        }
        let input_schema = agg.input().schema();
        let mut keys = Vec::new();
        let mut any_dictionary = false;
        for (expr, _) in group.expr() {
            let Some(col) = expr.downcast_ref::<Column>() else {
                return Ok(None);
            };
            let field = input_schema.field(col.index());
            let dt = field.data_type();
            if field.is_nullable() || !(is_string_dictionary(dt) || *dt == DataType::Utf8) {
                return Ok(None);
            }
            any_dictionary |= is_string_dictionary(dt);
            keys.push(col.index());
        }
        if !any_dictionary {
            return Ok(None);
        }
        let mut aggregates = Vec::new();
        for a in agg.aggr_expr() {
            if a.is_distinct() || !a.order_bys().is_empty() || a.expressions().len() != 1 {
                return Ok(None);
            }
            let arg = a.expressions().remove(0);
            let udf = a.fun().inner();
            let is_int64 = arg.data_type(&input_schema)? == DataType::Int64;
            let star = arg
                .downcast_ref::<Literal>()
                .is_some_and(|l| !l.value().is_null());
            let op = if udf.is::<Count>() {
                if star {
                    Op::CountRows
                } else {
                    Op::Count
                }
            } else if udf.is::<Sum>() && is_int64 {
                Op::Sum
            } else if udf.is::<Min>() && is_int64 {
                Op::Min
            } else if udf.is::<Max>() && is_int64 {
                Op::Max
            } else {
                return Ok(None);
            };
            // The state must be the one this node writes: one Int64 column.
            let state = a.state_fields()?;
            if state.len() != 1 || *state[0].data_type() != DataType::Int64 {
                return Ok(None);
            }
            aggregates.push(Aggregate {
                op,
                arg: (op != Op::CountRows).then_some(arg),
            });
        }
        let props = Arc::new(
            agg.properties()
                .as_ref()
                .clone()
                .with_emission_type(EmissionType::Final),
        );
        Ok(Some(DictionaryPartialAggregateExec {
            agg: Arc::new(agg.clone()),
            input: Arc::clone(agg.input()),
            keys: keys.into(),
            aggregates: aggregates.into(),
            props,
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }
}

impl DisplayAs for DictionaryPartialAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self
            .agg
            .group_expr()
            .expr()
            .iter()
            .map(|(_, n)| n.as_str())
            .collect();
        let aggs: Vec<&str> = self.agg.aggr_expr().iter().map(|a| a.name()).collect();
        write!(
            f,
            "DictionaryPartialAggregateExec: gby=[{}], aggr=[{}]",
            names.join(", "),
            aggs.join(", ")
        )
    }
}

impl ExecutionPlan for DictionaryPartialAggregateExec {
    fn name(&self) -> &str {
        "DictionaryPartialAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.agg.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let agg = Arc::clone(&self.agg).replace_children(children, options)?;
        let agg = agg
            .downcast_ref::<AggregateExec>()
            .ok_or_else(|| DataFusionError::Internal("expected an AggregateExec".into()))?;
        match DictionaryPartialAggregateExec::try_new(agg)? {
            Some(e) => Ok(Arc::new(e)),
            None => Ok(Arc::new(agg.clone())),
        }
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, Arc::clone(&context))?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = self.schema();
        let ordering = self.props.output_ordering().cloned();
        let batch_size = context.session_config().batch_size();
        let mut state = GroupState::new(Arc::clone(&self.keys), Arc::clone(&self.aggregates));
        let out_schema = Arc::clone(&schema);
        let stream = futures::stream::once(async move {
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                state.update(&batch)?;
            }
            let _timer = baseline.elapsed_compute().timer();
            let mut out = state.emit(&out_schema)?;
            if let Some(ordering) = &ordering {
                out = sort_batch(&out, ordering, None)?;
            }
            baseline.record_output(out.num_rows());
            let batches: Vec<Result<RecordBatch>> = (0..out.num_rows())
                .step_by(batch_size.max(1))
                .map(|at| Ok(out.slice(at, batch_size.min(out.num_rows() - at))))
                .collect();
            Ok::<_, DataFusionError>(futures::stream::iter(batches))
        })
        .map(|r| match r {
            Ok(s) => s.boxed(),
            Err(e) => futures::stream::iter(vec![Err(e)]).boxed(),
        })
        .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The distinct strings of one group column, numbered in order of appearance.
#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
    values: Vec<String>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.values.len() as u32;
        self.values.push(s.to_string());
        self.ids.insert(s.to_string(), id);
        id
    }
}

/// Ids of one group column in one batch.
enum ColumnIds {
    /// Every row has this id.
    Constant(u32),
    /// Per row.
    Rows(Vec<u32>),
    /// Per row by dictionary code: `codes[row]` indexes `values`.
    Codes { codes: Codes, values: ArrayRef },
}

/// The dictionary codes of one batch: the store's Int32 keys as read, other key types widened.
enum Codes {
    Int32(ScalarBuffer<i32>),
    Other(Vec<usize>),
}

impl Codes {
    fn at(&self, row: usize) -> usize {
        match self {
            Codes::Int32(k) => k[row] as usize,
            Codes::Other(k) => k[row],
        }
    }
}

/// Groups and their accumulators for one partition.
struct GroupState {
    keys: Arc<[usize]>,
    aggregates: Arc<[Aggregate]>,
    interners: Vec<Interner>,
    /// Group id of each tuple of column ids.
    groups: HashMap<Vec<u32>, u32>,
    /// Column ids of each group, flattened (`keys.len()` per group).
    group_keys: Vec<u32>,
    /// Per aggregate: value per group and whether it saw a value.
    values: Vec<Vec<i64>>,
    seen: Vec<Vec<bool>>,
}

impl GroupState {
    fn new(keys: Arc<[usize]>, aggregates: Arc<[Aggregate]>) -> Self {
        GroupState {
            interners: keys.iter().map(|_| Interner::default()).collect(),
            groups: HashMap::new(),
            group_keys: Vec::new(),
            values: aggregates.iter().map(|_| Vec::new()).collect(),
            seen: aggregates.iter().map(|_| Vec::new()).collect(),
            keys,
            aggregates,
        }
    }

    fn group_of(&mut self, tuple: &[u32]) -> u32 {
        if let Some(&g) = self.groups.get(tuple) {
            return g;
        }
        let g = self.groups.len() as u32;
        self.groups.insert(tuple.to_vec(), g);
        self.group_keys.extend_from_slice(tuple);
        let aggregates = Arc::clone(&self.aggregates);
        for (a, (v, s)) in aggregates
            .iter()
            .zip(self.values.iter_mut().zip(self.seen.iter_mut()))
        {
            v.push(match a.op {
                Op::Min => i64::MAX,
                Op::Max => i64::MIN,
                _ => 0,
            });
            s.push(false);
        }
        g
    }

    fn column_ids(&mut self, c: usize, column: &ArrayRef) -> Result<ColumnIds> {
        let n = column.len();
        if let Some(dict) = column.as_any_dictionary_opt() {
            let values = Arc::clone(dict.values());
            // Valid keys index `values` (the Parquet reader checks them), and group columns
            // have no nulls, so Int32 keys are used as they are.
            let codes = match column.as_dictionary_opt::<Int32Type>() {
                Some(d) => Codes::Int32(d.keys().values().clone()),
                None => Codes::Other(dict.normalized_keys()),
            };
            if values.len() == 1 {
                let text = values.as_string_opt::<i32>().ok_or_else(not_utf8)?;
                return Ok(ColumnIds::Constant(self.interners[c].id(text.value(0))));
            }
            return Ok(ColumnIds::Codes { codes, values });
        }
        let text = column.as_string_opt::<i32>().ok_or_else(not_utf8)?;
        if n == 0 {
            return Ok(ColumnIds::Rows(Vec::new()));
        }
        if is_constant(text) {
            return Ok(ColumnIds::Constant(self.interners[c].id(text.value(0))));
        }
        let interner = &mut self.interners[c];
        Ok(ColumnIds::Rows(
            (0..n).map(|i| interner.id(text.value(i))).collect(),
        ))
    }

    fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let mut columns = Vec::with_capacity(self.keys.len());
        let keys = Arc::clone(&self.keys);
        for (c, &i) in keys.iter().enumerate() {
            columns.push(self.column_ids(c, batch.column(i))?);
        }
        // Group of every row: through a per-code table when at most one column varies by code
        // and the others are constant (the common case), else tuple by tuple.
        let mut group = vec![0u32; n];
        let varying: Vec<usize> = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| !matches!(c, ColumnIds::Constant(_)))
            .map(|(i, _)| i)
            .collect();
        let mut tuple: Vec<u32> = columns
            .iter()
            .map(|c| match c {
                ColumnIds::Constant(id) => *id,
                _ => 0,
            })
            .collect();
        match varying.as_slice() {
            [] => group.fill(self.group_of(&tuple)),
            [v] if matches!(columns[*v], ColumnIds::Codes { .. }) => {
                let ColumnIds::Codes { codes, values } = &columns[*v] else {
                    unreachable!("matched above")
                };
                let text = values.as_string_opt::<i32>().ok_or_else(not_utf8)?;
                let mut by_code = vec![u32::MAX; values.len()];
                // The first row of each code in the batch looks its group up; the rest read
                // `by_code` (kept out of the closure so that this loop stays tight).
                let mut first_of_code = |code: usize| {
                    tuple[*v] = self.interners[*v].id(text.value(code));
                    self.group_of(&tuple)
                };
                match codes {
                    Codes::Int32(k) => assign_groups(
                        &mut group,
                        k.iter().map(|&c| c as usize),
                        &mut by_code,
                        &mut first_of_code,
                    ),
                    Codes::Other(k) => assign_groups(
                        &mut group,
                        k.iter().copied(),
                        &mut by_code,
                        &mut first_of_code,
                    ),
                }
            }
            _ => {
                for (row, g) in group.iter_mut().enumerate() {
                    for &v in &varying {
                        tuple[v] = match &columns[v] {
                            ColumnIds::Rows(ids) => ids[row],
                            ColumnIds::Codes { codes, values } => {
                                let text = values.as_string_opt::<i32>().ok_or_else(not_utf8)?;
                                self.interners[v].id(text.value(codes.at(row)))
                            }
                            ColumnIds::Constant(id) => *id,
                        };
                    }
                    *g = self.group_of(&tuple);
                }
            }
        }
        let aggregates = Arc::clone(&self.aggregates);
        for (a, agg) in aggregates.iter().enumerate() {
            let values = &mut self.values[a];
            let seen = &mut self.seen[a];
            let Some(arg) = &agg.arg else {
                for &g in &group {
                    values[g as usize] += 1;
                }
                continue;
            };
            let arg = arg.evaluate(batch)?.into_array(n)?;
            let nulls = arg.logical_nulls();
            let valid = |row: usize| nulls.as_ref().is_none_or(|b| b.is_valid(row));
            if agg.op == Op::Count {
                for (row, &g) in group.iter().enumerate() {
                    if valid(row) {
                        values[g as usize] += 1;
                    }
                }
                continue;
            }
            let ints = arg
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| DataFusionError::Internal("aggregate argument is not Int64".into()))?
                .values();
            let nulls = nulls.as_ref();
            match agg.op {
                Op::Sum => fold_into(values, seen, &group, ints, nulls, i64::wrapping_add),
                Op::Min => fold_into(values, seen, &group, ints, nulls, i64::min),
                Op::Max => fold_into(values, seen, &group, ints, nulls, i64::max),
                Op::Count | Op::CountRows => unreachable!("counted above"),
            }
        }
        Ok(())
    }

    /// Every group as one batch of `schema`: the group columns, then one state column per
    /// aggregate (NULL for a sum/min/max that saw no value; counts are never NULL).
    fn emit(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        let n = self.groups.len();
        let width = self.keys.len();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for (c, field) in schema.fields().iter().take(width).enumerate() {
            let interner = &self.interners[c];
            let text = StringArray::from_iter_values(
                (0..n).map(|g| interner.values[self.group_keys[g * width + c] as usize].as_str()),
            );
            columns.push(cast(&text, field.data_type())?);
        }
        for (a, agg) in self.aggregates.iter().enumerate() {
            let nulls = match agg.op {
                Op::Count | Op::CountRows => None,
                _ => {
                    let mut b = BooleanBufferBuilder::new(n);
                    b.append_slice(&self.seen[a]);
                    Some(NullBuffer::new(b.finish()))
                }
            };
            columns.push(Arc::new(Int64Array::new(
                self.values[a].clone().into(),
                nulls,
            )));
        }
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

/// `group[row]` = the group of `codes[row]`: `by_code` caches it, `first_of_code` finds it.
fn assign_groups(
    group: &mut [u32],
    codes: impl Iterator<Item = usize>,
    by_code: &mut [u32],
    first_of_code: &mut impl FnMut(usize) -> u32,
) {
    for (g, code) in group.iter_mut().zip(codes) {
        let mut id = by_code[code];
        if id == u32::MAX {
            id = first_of_code(code);
            by_code[code] = id;
        }
        *g = id;
    }
}

/// Folds `ints[row]` into `values[group[row]]` for every row not NULL in `nulls`.
fn fold_into(
    values: &mut [i64],
    seen: &mut [bool],
    group: &[u32],
    ints: &[i64],
    nulls: Option<&NullBuffer>,
    fold: impl Fn(i64, i64) -> i64,
) {
    match nulls {
        None => {
            for (&g, &v) in group.iter().zip(ints) {
                let g = g as usize;
                values[g] = fold(values[g], v);
                seen[g] = true;
            }
        }
        Some(nulls) => {
            for row in nulls.valid_indices() {
                let g = group[row] as usize;
                values[g] = fold(values[g], ints[row]);
                seen[g] = true;
            }
        }
    }
}

/// Whether every value of `text` equals the first (a partition column such as `run` is one
/// value repeated): all lengths equal and the value bytes periodic with that length, so two
/// comparisons of whole buffers instead of one per row.
fn is_constant(text: &StringArray) -> bool {
    let offsets = text.value_offsets();
    let len = (offsets[1] - offsets[0]) as usize;
    if !offsets.windows(2).all(|w| (w[1] - w[0]) as usize == len) {
        return false;
    }
    let bytes = &text.value_data()[offsets[0] as usize..offsets[offsets.len() - 1] as usize];
    len == 0 || bytes[len..] == bytes[..bytes.len() - len]
}

fn not_utf8() -> DataFusionError {
    DataFusionError::Internal("group column is not Utf8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_is_constant_only_when_every_value_equals_the_first() {
        let constant = |v: Vec<&str>| is_constant(&StringArray::from(v));
        assert!(constant(vec!["r0001", "r0001", "r0001"]));
        assert!(constant(vec!["x"]));
        assert!(constant(vec!["", ""]));
        assert!(!constant(vec!["ab", "ab", "ba"]));
        assert!(!constant(vec!["aa", "ab"]));
        assert!(!constant(vec!["ab", "abab"]));
        assert!(!constant(vec!["ab", "", "ab"]));
        let sliced = StringArray::from(vec!["q", "ab", "ab", "z"]);
        assert!(is_constant(&sliced.slice(1, 2)));
        assert!(!is_constant(&sliced.slice(1, 3)));
    }
}
