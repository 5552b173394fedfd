//! `module_breakdown(run [, depth] [, steps])`: GPU kernel time per `nn.Module` path, forward,
//! backward and recomputation apart.
//!
//! PyTorch's profiler, with `with_stack=True`, writes a `python_function` range
//! `nn.Module: Name_n` around each module's `forward`. A kernel belongs to the modules whose
//! ranges hold the runtime call that launched it (matched by correlation id), on that call's
//! thread: its **path** is their names from the outermost in, `Qwen2Model_0/Qwen2DecoderLayer_3/
//! Qwen2MLP_3/Linear_9`.
//!
//! The backward runs on autograd's thread, outside every module range. Each of its nodes runs
//! inside `autograd::engine::evaluate_function: XBackward0`, which carries the `Sequence number`
//! of the forward operator that made the node; that operator's module path is the backward
//! kernel's path (pass `backward`). Modules run again inside a backward node are activation
//! checkpointing's recomputation (pass `recompute`), their path the node's path followed by the
//! modules run again. Kernels launched outside any module and any backward node (the
//! optimizer, data movement) have pass `other` and module `(none)`, so the shares of a run add
//! up to 100.
//!
//! Columns: `module` (the path cut to `depth` modules when given), `pass`, `depth` (modules in
//! `module`), `gpu_time` (sum of kernel durations), `kernels`, `share` (% of the run's kernel
//! time), `top_kernel` and `top_kernel_time` (the kernel name with the most time in the row).
//! With a step range the kernels whose launch call starts in the selected steps count.
//!
//! ```sql
//! SELECT module, pass, fmt_dur(gpu_time), share, top_kernel FROM module_breakdown('resnet', 2);
//! ```

use super::data::{collect, ints, launches_by_thread, strings, GpuOp, Names, Scope, Thread};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::Arc;

pub static MODULE_BREAKDOWN: Spec = Spec {
    name: "module_breakdown",
    params: &["depth"],
    schema,
    compute: |ctx, call| compute(ctx, call).boxed(),
    validate: |call| match call.int(0) {
        Some(d) if d < 1 => Err(format!("depth must be >= 1, got {d}")),
        _ => Ok(()),
    },
};

/// The prefix PyTorch gives a module's range.
pub const MODULE_PREFIX: &str = "nn.Module: ";

/// The name of autograd's range around one backward node.
const BACKWARD_PREFIX: &str = "autograd::engine::evaluate_function: ";

/// The module of kernels launched outside every module.
pub const NO_MODULE: &str = "(none)";

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("module", DataType::Utf8, false),
        Field::new("pass", DataType::Utf8, false),
        Field::new("depth", DataType::Int64, false),
        Field::new("gpu_time", DataType::Int64, false),
        Field::new("kernels", DataType::Int64, false),
        Field::new("share", DataType::Float64, false),
        Field::new("top_kernel", DataType::Utf8, false),
        Field::new("top_kernel_time", DataType::Int64, false),
    ]))
}

/// Which pass launched a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    Forward,
    Backward,
    Recompute,
    Other,
}

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::Recompute => "recompute",
            Pass::Other => "other",
        }
    }
}

/// A host range that places launches: a module's forward, a backward node, or a forward
/// operator whose sequence number backward nodes refer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Interned module name (`Linear_0`).
    Module(u32),
    /// A backward node, with the sequence number of its forward operator.
    Backward(Option<i64>),
    /// A forward operator's sequence number.
    Forward(i64),
}

#[derive(Debug, Clone, Copy)]
pub struct Item {
    pub start: i64,
    pub end: i64,
    pub marker: Marker,
}

/// Where one launch call sits: the backward node around it (its sequence number) if any, and
/// the modules around it inside that node (or at all, outside a backward).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub backward: Option<Option<i64>>,
    pub modules: Vec<u32>,
}

/// A forward operator outside backward nodes: its sequence number, start and module path.
pub type Forward = (i64, i64, Vec<u32>);

/// One thread's sweep: where each launch sits (in the order given), and the forward
/// operators.
pub fn place_thread(items: &mut [Item], launches: &[(i64, i64)]) -> (Vec<Placed>, Vec<Forward>) {
    items.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
    let mut order: Vec<usize> = (0..launches.len()).collect();
    order.sort_by_key(|&i| launches[i].0);
    let mut placed = vec![
        Placed {
            backward: None,
            modules: Vec::new(),
        };
        launches.len()
    ];
    let mut forward = Vec::new();
    // Items not yet ended, outermost first. Not a stack: profilers' ranges on one thread
    // can overlap without nesting (rounding at their ends), and each is tested on its own.
    let mut open: Vec<usize> = Vec::new();
    let mut next = order.into_iter().peekable();
    // Where a span [s, e] sits among the open items that hold it.
    let place = |open: &[usize], items: &[Item], s: i64, e: i64| {
        let mut p = Placed {
            backward: None,
            modules: Vec::new(),
        };
        for &i in open {
            let it = &items[i];
            if !(it.start <= s && e <= it.end) {
                continue;
            }
            match it.marker {
                Marker::Module(m) => p.modules.push(m),
                Marker::Backward(seq) => {
                    // Modules outside the innermost backward node are not its path.
                    p.backward = Some(seq);
                    p.modules.clear();
                }
                Marker::Forward(_) => {}
            }
        }
        p
    };
    for i in 0..=items.len() {
        let next_start = items.get(i).map(|r| r.start);
        while let Some(l) = next.next_if(|&l| next_start.is_none_or(|t| launches[l].0 < t)) {
            let (s, e) = launches[l];
            open.retain(|&o| items[o].end >= s);
            placed[l] = place(&open, items, s, e);
        }
        let Some(it) = items.get(i) else { break };
        open.retain(|&o| items[o].end >= it.start);
        if let Marker::Forward(seq) = it.marker {
            let p = place(&open, items, it.start, it.end);
            if p.backward.is_none() {
                forward.push((seq, it.start, p.modules));
            }
        }
        open.push(i);
    }
    (placed, forward)
}

/// The pass and module path of a placed launch, given the forward operators' paths.
pub fn resolve(p: &Placed, forward_path: impl Fn(i64) -> Option<Vec<u32>>) -> (Pass, Vec<u32>) {
    match p.backward {
        Some(seq) => {
            let mut path = seq.and_then(forward_path).unwrap_or_default();
            if p.modules.is_empty() {
                (Pass::Backward, path)
            } else {
                path.extend_from_slice(&p.modules);
                (Pass::Recompute, path)
            }
        }
        None if p.modules.is_empty() => (Pass::Other, Vec::new()),
        None => (Pass::Forward, p.modules.clone()),
    }
}

/// How many `nn.Module` ranges `run` holds (none: the trace was recorded without
/// `with_stack`, and every kernel is under [`NO_MODULE`]).
pub async fn module_ranges(ctx: &SessionContext, run: &str) -> Result<i64> {
    let sql = format!(
        "SELECT count(*) FROM events WHERE run = {} AND kind = 'python' AND name LIKE {}",
        literal(run),
        literal(&format!("{MODULE_PREFIX}%"))
    );
    let batches = collect(ctx, &sql).await?;
    Ok(batches
        .first()
        .map(|b| ints(b, 0))
        .transpose()?
        .and_then(|v| v.first().copied().flatten())
        .unwrap_or(0))
}

/// One kernel: interned name and duration.
type Kernel = (u32, i64);

/// Per (path, pass): kernel time per kernel name.
#[derive(Default)]
struct Row {
    time: i64,
    kernels: i64,
    by_name: HashMap<u32, i64>,
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope: Scope = call.scope(&ctx).await?;
    let depth = call.int(0).map(|d| d as usize);
    let run = literal(&call.run);
    let mut names = Names::default();
    let mut total = 0i64;
    let mut rows: HashMap<(Vec<u32>, Pass), Row> = HashMap::new();
    let add = |rows: &mut HashMap<(Vec<u32>, Pass), Row>, path: &[u32], pass, k: Kernel| {
        let path = depth.map_or(path, |d| &path[..path.len().min(d)]);
        let row = rows.entry((path.to_vec(), pass)).or_default();
        row.time += k.1;
        row.kernels += 1;
        *row.by_name.entry(k.0).or_default() += k.1;
    };
    let in_scope = |rank: Option<i32>, ts: i64| {
        scope
            .window(rank)
            .is_none_or(|(lo, hi)| ts >= lo && ts < hi)
    };

    // Launch calls by thread, each with its kernels (counted when the call is in scope);
    // kernels without a call count by their own start.
    let kernels = launches_by_thread(&ctx, &call.run, &mut names, &["kernel"]).await?;
    let kernel = |o: &GpuOp| (o.name, o.end - o.start);
    for (rank, o) in &kernels.unlaunched {
        if in_scope(*rank, o.start) {
            total += o.end - o.start;
            add(&mut rows, &[], Pass::Other, kernel(o));
        }
    }
    let mut launches: HashMap<Thread, (Vec<(i64, i64)>, Vec<Vec<Kernel>>)> = HashMap::new();
    for (thread, calls) in kernels.by_thread {
        for c in calls.into_iter().filter(|c| in_scope(thread.0, c.start)) {
            let entry = launches.entry(thread).or_default();
            entry.0.push((c.start, c.end));
            entry.1.push(c.ops.iter().map(kernel).collect());
        }
    }

    // Module ranges, backward nodes and forward operators with a sequence number.
    let mut items: HashMap<Thread, Vec<Item>> = HashMap::new();
    let sql = format!(
        "SELECT rank, pid, tid, name, ts, ts + dur, \
         CASE WHEN kind = 'cpu_op' THEN json_get_int(args, 'Sequence number') END \
         FROM events WHERE run = {run} AND dur >= 0 AND ((kind = 'python' AND name LIKE \
         {module}) OR (kind = 'cpu_op' AND (name LIKE {node} OR args LIKE '%Sequence number%')))",
        module = literal(&format!("{MODULE_PREFIX}%")),
        node = literal(&format!("{BACKWARD_PREFIX}%")),
    );
    for b in collect(&ctx, &sql).await? {
        let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (name, ts, end, seq) = (strings(&b, 3)?, ints(&b, 4)?, ints(&b, 5)?, ints(&b, 6)?);
        for i in 0..b.num_rows() {
            let thread = (rank[i].map(|r| r as i32), pid[i], tid[i]);
            let (Some(start), Some(end)) = (ts[i], end[i]) else {
                continue;
            };
            let name = name[i].as_deref().unwrap_or("");
            let marker = if let Some(module) = name.strip_prefix(MODULE_PREFIX) {
                Marker::Module(names.id(module))
            } else if name.starts_with(BACKWARD_PREFIX) {
                Marker::Backward(seq[i])
            } else if let Some(seq) = seq[i] {
                Marker::Forward(seq)
            } else {
                continue;
            };
            items
                .entry(thread)
                .or_default()
                .push(Item { start, end, marker });
        }
    }

    // Sequence numbers are counted per process: (rank, pid, seq) -> the first forward
    // operator's start and path.
    let mut forward: HashMap<(Option<i32>, Option<i64>, i64), (i64, Vec<u32>)> = HashMap::new();
    let mut keep_first = |thread: &Thread, (seq, start, path): Forward| {
        let slot = forward
            .entry((thread.0, thread.1, seq))
            .or_insert((start, path.clone()));
        if start < slot.0 {
            *slot = (start, path);
        }
    };
    let mut placed = Vec::new();
    for (thread, (calls, ks)) in launches {
        let mut thread_items = items.remove(&thread).unwrap_or_default();
        let (places, fwd) = place_thread(&mut thread_items, &calls);
        for f in fwd {
            keep_first(&thread, f);
        }
        placed.push((thread, places, ks));
    }
    // Threads that launched nothing still hold forward operators (a data-parallel model's
    // forward may launch on one thread and record on another).
    for (thread, mut thread_items) in items {
        for f in place_thread(&mut thread_items, &[]).1 {
            keep_first(&thread, f);
        }
    }
    for (thread, places, ks) in placed {
        for (p, ks) in places.iter().zip(ks) {
            let (pass, path) = resolve(p, |seq| {
                forward
                    .get(&(thread.0, thread.1, seq))
                    .map(|(_, path)| path.clone())
            });
            for k in ks {
                total += k.1;
                add(&mut rows, &path, pass, k);
            }
        }
    }

    let rows: Vec<((Vec<u32>, Pass), Row)> = rows.into_iter().collect();
    let path_text = |path: &[u32]| {
        if path.is_empty() {
            NO_MODULE.to_string()
        } else {
            path.iter()
                .map(|&m| names.get(m))
                .collect::<Vec<_>>()
                .join("/")
        }
    };
    let texts: Vec<String> = rows.iter().map(|((p, _), _)| path_text(p)).collect();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| {
        rows[b]
            .1
            .time
            .cmp(&rows[a].1.time)
            .then_with(|| texts[a].cmp(&texts[b]))
            .then_with(|| rows[a].0 .1.cmp(&rows[b].0 .1))
    });
    let top = |r: &Row| {
        r.by_name
            .iter()
            .max_by(|a, b| {
                a.1.cmp(b.1)
                    .then_with(|| names.get(*b.0).cmp(names.get(*a.0)))
            })
            .map_or(("", 0), |(&n, &t)| (names.get(n), t))
    };
    let share = |t: i64| {
        if total > 0 {
            100.0 * t as f64 / total as f64
        } else {
            0.0
        }
    };
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(StringArray::from_iter_values(
            order.iter().map(|&i| texts[i].as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            order.iter().map(|&i| rows[i].0 .1.name()),
        )),
        Arc::new(Int64Array::from_iter_values(
            order.iter().map(|&i| rows[i].0 .0.len() as i64),
        )),
        Arc::new(Int64Array::from_iter_values(
            order.iter().map(|&i| rows[i].1.time),
        )),
        Arc::new(Int64Array::from_iter_values(
            order.iter().map(|&i| rows[i].1.kernels),
        )),
        Arc::new(Float64Array::from_iter_values(
            order.iter().map(|&i| share(rows[i].1.time)),
        )),
        Arc::new(StringArray::from_iter_values(
            order.iter().map(|&i| top(&rows[i].1).0),
        )),
        Arc::new(Int64Array::from_iter_values(
            order.iter().map(|&i| top(&rows[i].1).1),
        )),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(start: i64, end: i64, marker: Marker) -> Item {
        Item { start, end, marker }
    }

    #[test]
    fn a_launch_takes_the_modules_around_it_and_a_backward_node_its_forwards_path() {
        use Marker::*;
        // Forward thread: Model [0,100) > Layer [10,50) > Linear [20,40), with the forward
        // operator seq 7 inside Linear and seq 8 inside Layer only.
        let mut fwd = vec![
            item(20, 40, Module(2)),
            item(0, 100, Module(0)),
            item(10, 50, Module(1)),
            item(22, 30, Forward(7)),
            item(42, 45, Forward(8)),
        ];
        let launches = [(25, 26), (43, 44), (60, 61), (200, 201)];
        let (placed, forward) = place_thread(&mut fwd, &launches);
        assert_eq!(placed[0].modules, vec![0, 1, 2]);
        assert_eq!(placed[1].modules, vec![0, 1]);
        assert_eq!(placed[2].modules, vec![0]);
        assert!(placed[3].modules.is_empty() && placed[3].backward.is_none());
        assert_eq!(forward, vec![(7, 22, vec![0, 1, 2]), (8, 42, vec![0, 1])]);
        // Backward thread: node for seq 7 [300,320), node for seq 8 [330,360) running Layer
        // again (recompute) [335,350), and an optimizer launch at 400.
        let mut bwd = vec![
            item(300, 320, Backward(Some(7))),
            item(330, 360, Backward(Some(8))),
            item(335, 350, Module(1)),
            item(336, 340, Forward(9)),
        ];
        let launches = [(305, 306), (338, 339), (355, 356), (400, 401)];
        let (placed, forward_b) = place_thread(&mut bwd, &launches);
        assert!(
            forward_b.is_empty(),
            "operators inside backward nodes are not forwards"
        );
        let paths: HashMap<i64, Vec<u32>> = forward.into_iter().map(|(s, _, p)| (s, p)).collect();
        let got: Vec<(Pass, Vec<u32>)> = placed
            .iter()
            .map(|p| resolve(p, |s| paths.get(&s).cloned()))
            .collect();
        assert_eq!(
            got,
            vec![
                (Pass::Backward, vec![0, 1, 2]),
                (Pass::Recompute, vec![0, 1, 1]),
                (Pass::Backward, vec![0, 1]),
                (Pass::Other, vec![]),
            ]
        );
    }

    #[test]
    fn a_backward_node_without_a_known_forward_has_no_module() {
        let p = Placed {
            backward: Some(Some(99)),
            modules: vec![],
        };
        assert_eq!(resolve(&p, |_| None), (Pass::Backward, vec![]));
        let p = Placed {
            backward: Some(None),
            modules: vec![3],
        };
        assert_eq!(resolve(&p, |_| None), (Pass::Recompute, vec![3]));
    }
}
