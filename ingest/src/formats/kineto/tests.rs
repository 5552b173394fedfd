use super::event::{copy_kind_of_direction, of_skipped_phase};
use super::*;
use crate::attribute::Resolver;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use gpuq_testkit::{ints, strings};

fn parse_str(text: &str) -> Result<ParsedTrace, TraceError> {
    parse(text.as_bytes(), &|_| {})
}

/// All events of a parsed trace, resolved, as one batch.
fn resolved(t: ParsedTrace) -> RecordBatch {
    let schema = gpuq_engine::schema::events_schema();
    let all = concat_batches(&schema, &t.batches).unwrap();
    let base = t.time_base_ns;
    Resolver::new(t.host).resolve(&all, Some(0), base).unwrap()
}

fn row_of(b: &RecordBatch, name: &str) -> usize {
    strings(b, "name")
        .iter()
        .position(|n| n.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no event {name}"))
}

const MODERN: &str = r###"{
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
  "traceEvents": [
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 10, "tid": 11, "ts": 100.000, "dur": 900.000, "args": {"External id": 1}},
  {"ph": "X", "cat": "user_annotation", "name": "## forward ##", "pid": 10, "tid": 11, "ts": 110.5, "dur": 400, "args": {}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 10, "tid": 11, "ts": 120.000, "dur": 100.000, "args": {"External id": 2}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 10, "tid": 11, "ts": 121.000, "dur": 50.000, "args": {"External id": 3}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 122.250, "dur": 5.125, "args": {"External id": 3, "cbid": 211, "correlation": 501}},
  {"ph": "s", "id": 501, "pid": 10, "tid": 11, "ts": 122.250, "cat": "ac2g", "name": "ac2g"},
  {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 130.001, "dur": 20.999,
   "args": {"External id": 3, "device": 0, "stream": 7, "correlation": 501, "registers per thread": 168, "shared memory": 98304, "grid": [132, 1, 1], "block": [384, 2, 1]}},
  {"ph": "f", "id": 501, "pid": 0, "tid": 7, "ts": 130.001, "cat": "ac2g", "name": "ac2g", "bp": "e"},
  {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "pid": 10, "tid": 11, "ts": 200, "dur": 3, "args": {"cbid": 307, "correlation": 502}},
  {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_0", "pid": 0, "tid": 7, "ts": 210, "dur": 4, "args": {"device": 0, "stream": 7, "correlation": 502}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 10, "tid": 11, "ts": 600, "dur": 10, "args": {"correlation": 503}},
  {"ph": "X", "cat": "kernel", "name": "graph_k", "pid": 0, "tid": 8, "ts": 620, "dur": 1, "args": {"device": 0, "stream": 8, "correlation": 503}},
  {"ph": "X", "cat": "kernel", "name": "graph_k", "pid": 0, "tid": 8, "ts": 622, "dur": 1, "args": {"device": 0, "stream": 8, "correlation": 503}},
  {"ph": "X", "cat": "kernel", "name": "early_k", "pid": 0, "tid": 7, "ts": 50, "dur": 2, "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 20, "ts": 300, "dur": 10, "args": {"device": 0, "stream": 20, "correlation": 504, "bytes": 4096}},
  {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 20, "ts": 320, "dur": 1, "args": {"device": 0, "stream": 20, "bytes": 64}},
  {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 10, "tid": 11, "ts": 125, "s": "t", "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048}},
  {"ph": "X", "cat": "python_function", "name": "train.py(10): step", "pid": 10, "tid": 11, "ts": 101, "dur": 800},
  {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 90, "dur": 1000, "args": {"Op count": 0}},
  {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}
  ],
  "baseTimeNanoseconds": 1700000000000000000,
  "metadata": {"env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123"}}
}"###;

#[test]
fn parses_the_modern_shape_with_exact_times() {
    let t = parse_str(MODERN).unwrap();
    assert_eq!(t.time_base_ns, 1_700_000_000_000_000_000);
    assert_eq!(t.events, 17);
    assert_eq!(t.kernels, 5);
    assert!(t.top_level.contains_key("distributedInfo"));
    assert!(!t.top_level.contains_key("traceEvents"));
    let counters: usize = t.counters.iter().map(|b| b.num_rows()).sum();
    assert_eq!(counters, 2);
    let b = resolved(t);
    let gemm = row_of(&b, "sm90_gemm");
    assert_eq!(ints(&b, "ts")[gemm], Some(1_700_000_000_000_130_001));
    assert_eq!(ints(&b, "dur")[gemm], Some(20_999));
    assert_eq!(ints(&b, "device")[gemm], Some(0));
    assert_eq!(ints(&b, "stream")[gemm], Some(7));
    assert_eq!(ints(&b, "correlation")[gemm], Some(501));
    assert_eq!(ints(&b, "grid_x")[gemm], Some(132));
    assert_eq!(ints(&b, "block_y")[gemm], Some(2));
    assert_eq!(ints(&b, "registers")[gemm], Some(168));
    assert_eq!(ints(&b, "shared_mem")[gemm], Some(98304));
    assert_eq!(strings(&b, "kind")[gemm].as_deref(), Some("kernel"));
    // Attribution through the launch call.
    assert_eq!(strings(&b, "op")[gemm].as_deref(), Some("aten::addmm"));
    assert_eq!(strings(&b, "scope")[gemm].as_deref(), Some("## forward ##"));
    assert_eq!(ints(&b, "step")[gemm], Some(7));
    assert_eq!(ints(&b, "rank")[gemm], Some(0));
    // cuda_driver launches attribute too; the launch itself gets its op.
    let triton = row_of(&b, "triton_poi_fused_add_0");
    assert_eq!(ints(&b, "step")[triton], Some(7));
    let launch = row_of(&b, "cudaLaunchKernel");
    assert_eq!(strings(&b, "op")[launch].as_deref(), Some("aten::addmm"));
    assert_eq!(strings(&b, "kind")[launch].as_deref(), Some("runtime"));
    assert_eq!(
        strings(&b, "kind")[row_of(&b, "cuLaunchKernelEx")].as_deref(),
        Some("driver")
    );
    // Annotations: their scope is the enclosing one, not themselves.
    let fwd = row_of(&b, "## forward ##");
    assert_eq!(strings(&b, "scope")[fwd].as_deref(), Some("ProfilerStep#7"));
    assert_eq!(strings(&b, "scope")[row_of(&b, "ProfilerStep#7")], None);
    assert_eq!(ints(&b, "step")[row_of(&b, "ProfilerStep#7")], Some(7));
    // GPU work launched before the window has no launch: no op, step by its own time (none here).
    let early = row_of(&b, "early_k");
    assert_eq!(strings(&b, "op")[early], None);
    assert_eq!(ints(&b, "step")[early], None);
    // Copies and memsets.
    let copy = row_of(&b, "Memcpy HtoD (Pageable -> Device)");
    assert_eq!(strings(&b, "copy_kind")[copy].as_deref(), Some("HtoD"));
    assert_eq!(ints(&b, "bytes")[copy], Some(4096));
    assert_eq!(
        strings(&b, "kind")[row_of(&b, "Memset (Device)")].as_deref(),
        Some("memset")
    );
    assert_eq!(
        strings(&b, "kind")[row_of(&b, "[memory]")].as_deref(),
        Some("instant")
    );
    assert_eq!(
        strings(&b, "kind")[row_of(&b, "train.py(10): step")].as_deref(),
        Some("python")
    );
    // String pids/tids get stable negative ids and are kept in args.
    let span = row_of(&b, "PyTorch Profiler (0)");
    assert!(ints(&b, "pid")[span].unwrap() < 0);
    let args = strings(&b, "args")[span].clone().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&args).unwrap();
    assert_eq!(parsed["pid"], "Spans");
    assert_eq!(parsed["Op count"], 0);
    // Host events carry no device/stream.
    assert_eq!(ints(&b, "device")[launch], None);
    assert_eq!(ints(&b, "stream")[launch], None);
}

#[test]
fn graph_launch_fans_out_to_every_kernel() {
    let b = resolved(parse_str(MODERN).unwrap());
    let names = strings(&b, "name");
    let graph: Vec<usize> = (0..b.num_rows())
        .filter(|&i| names[i].as_deref() == Some("graph_k"))
        .collect();
    assert_eq!(graph.len(), 2);
    for i in graph {
        assert_eq!(ints(&b, "correlation")[i], Some(503));
        assert_eq!(ints(&b, "step")[i], Some(7));
        assert_eq!(strings(&b, "scope")[i].as_deref(), Some("ProfilerStep#7"));
    }
}

const LEGACY: &str = r###"{"schemaVersion": 1, "traceEvents": [
  {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 25738, "tid": "25738", "ts": 1623142623460172, "dur": 176078, "args": {"External id": 4}},
  {"ph": "X", "cat": "Operator", "name": "aten::conv2d", "pid": 25738, "tid": "25738", "ts": 1623142623460200, "dur": 100, "args": {"External id": 5}},
  {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 25738, "tid": "25738", "ts": 1623142623460210, "dur": 7, "args": {"cbid": 211, "correlation": 34441, "external id": 5, "external ts": 1623142623460200}},
  {"ph": "X", "cat": "Kernel", "name": "cask_cudnn::computeOffsetsKernel", "pid": 0, "tid": "stream 7", "ts": 1623142623531625, "dur": 2, "args": {"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 34441, "external id": 5, "grid": [50, 1, 1], "block": [256, 1, 1]}},
  {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": "stream 7", "ts": 1623142623531700, "dur": 3, "args": {"device": 0, "stream": 7, "correlation": 34450, "bytes": 8}},
  {"ph": "i", "s": "t", "name": "[memory]", "pid": 25738, "tid": 25738, "ts": 1623142623460121, "args": {"Device Type": 0, "Device Id": -1, "Bytes": 4}},
  {"ph": "f", "id": 34417, "pid": 0, "tid": "stream 7", "ts": 1623142623529248, "cat": "async", "name": "launch"},
  {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 1623142624633484}
]}"###;

#[test]
fn parses_the_legacy_2021_shape() {
    let t = parse_str(LEGACY).unwrap();
    assert_eq!(t.time_base_ns, 0);
    assert_eq!(t.events, 7);
    let b = resolved(t);
    let k = row_of(&b, "cask_cudnn::computeOffsetsKernel");
    assert_eq!(ints(&b, "ts")[k], Some(1_623_142_623_531_625_000));
    assert_eq!(ints(&b, "stream")[k], Some(7));
    assert_eq!(strings(&b, "kind")[k].as_deref(), Some("kernel"));
    assert_eq!(strings(&b, "op")[k].as_deref(), Some("aten::conv2d"));
    assert_eq!(ints(&b, "step")[k], Some(5));
    let op = row_of(&b, "aten::conv2d");
    assert_eq!(ints(&b, "tid")[op], Some(25738));
    assert_eq!(strings(&b, "kind")[op].as_deref(), Some("cpu_op"));
    // ProfilerStep filed as an Operator is a scope, not an operator.
    assert_eq!(strings(&b, "scope")[op].as_deref(), Some("ProfilerStep#5"));
    let copy = row_of(&b, "Memcpy DtoH (Device -> Pageable)");
    assert_eq!(strings(&b, "copy_kind")[copy].as_deref(), Some("DtoH"));
    let end = row_of(&b, "Record Window End");
    assert_eq!(ints(&b, "pid")[end], None);
}

const ROCM: &str = r###"{"traceEvents": [
  {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 597913, "tid": 597913, "ts": 4203669603438.000, "dur": 100.0, "args": {}},
  {"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "pid": 597913, "tid": 597913, "ts": 4203669603438.301, "dur": 60.204, "args": {"External id": 8, "stream": "0x0", "cid": 153, "correlation": 117, "kind": "1"}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "pid": 2, "tid": 0, "ts": 4203669603500.5, "dur": 1.5, "args": {"device": 2, "stream": 0, "correlation": 117, "kind": "DtoD"}},
  {"ph": "X", "cat": "kernel", "name": "Cijk_Alik_Bljk", "pid": 2, "tid": 0, "ts": 4203669603847.969, "dur": 17.600, "args": {"External id": 13, "device": 2, "stream": 0, "correlation": 121, "kind": "Dispatch Kernel"}}
]}"###;

#[test]
fn parses_the_rocm_shape() {
    let b = resolved(parse_str(ROCM).unwrap());
    let k = row_of(&b, "Cijk_Alik_Bljk");
    assert_eq!(ints(&b, "device")[k], Some(2));
    assert_eq!(ints(&b, "stream")[k], Some(0));
    assert_eq!(ints(&b, "ts")[k], Some(4_203_669_603_847_969));
    assert_eq!(ints(&b, "dur")[k], Some(17_600));
    let copy = row_of(&b, "Memcpy");
    assert_eq!(strings(&b, "copy_kind")[copy].as_deref(), Some("DtoD"));
    assert_eq!(strings(&b, "op")[copy].as_deref(), Some("aten::copy_"));
    let rt = row_of(&b, "hipMemcpyWithStream");
    assert_eq!(ints(&b, "stream")[rt], None, "host events carry no stream");
}

/// Meta MTIA (shape of HTA's `mtia_inference_trace`): device work in `mtia_ccp_events` on the
/// device's pid, launches in `mtia_runtime` linked by `correlation`.
const MTIA: &str = r###"{"schemaVersion": 1, "deviceProperties": [{"id": 17, "name": "ARTEMIS"}], "traceEvents": [
  {"ph": "X", "cat": "cpu_op", "name": "aten::matmul", "pid": 865, "tid": 1837, "ts": 1000.5, "dur": 40},
  {"ph": "X", "cat": "mtia_runtime", "name": "launchKernel", "pid": 865, "tid": 1837, "ts": 1001.25, "dur": 6.44, "args": {"correlation": 21600000, "device": 17, "stream_id": "108"}},
  {"ph": "f", "id": 21600000, "pid": 17, "tid": 3774, "ts": 1050.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
  {"ph": "X", "cat": "mtia_ccp_events", "name": "pe_exe", "pid": 17, "tid": 3910, "ts": 1050.125, "dur": 6900.41, "args": {"stream": 112, "column": "0", "row": "0", "correlation": 21600000}},
  {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 17, "tid": 3672, "ts": 1060.234, "dur": 5.24, "args": {"stream": 105, "direction": "DEVICE_TO_HOST", "size": 1024, "sqid": 8}},
  {"ph": "X", "cat": "mtia_ccp_events", "name": "event_wait", "pid": 17, "tid": 3774, "ts": 1070.596, "dur": 15863.105, "args": {"stream": 108, "wait_on_stream": 104}}
]}"###;

#[test]
fn parses_the_mtia_shape_as_device_work() {
    let t = parse_str(MTIA).unwrap();
    assert_eq!(t.kernels, 1);
    let b = resolved(t);
    let k = row_of(&b, "pe_exe");
    assert_eq!(strings(&b, "kind")[k].as_deref(), Some("kernel"));
    assert_eq!(ints(&b, "device")[k], Some(17));
    assert_eq!(ints(&b, "stream")[k], Some(112));
    assert_eq!(ints(&b, "dur")[k], Some(6_900_410));
    assert_eq!(strings(&b, "op")[k].as_deref(), Some("aten::matmul"));
    let dma = row_of(&b, "dma_request");
    assert_eq!(strings(&b, "kind")[dma].as_deref(), Some("memcpy"));
    assert_eq!(strings(&b, "copy_kind")[dma].as_deref(), Some("DtoH"));
    assert_eq!(ints(&b, "bytes")[dma], Some(1024));
    assert_eq!(ints(&b, "stream")[dma], Some(105));
    let wait = row_of(&b, "event_wait");
    assert_eq!(strings(&b, "kind")[wait].as_deref(), Some("sync"));
    assert_eq!(ints(&b, "stream")[wait], Some(108));
    let launch = row_of(&b, "launchKernel");
    assert_eq!(strings(&b, "kind")[launch].as_deref(), Some("runtime"));
    assert_eq!(ints(&b, "stream")[launch], None);
}

#[test]
fn mtia_copy_directions() {
    assert_eq!(copy_kind_of_direction("HOST_TO_DEVICE"), Some("HtoD"));
    assert_eq!(copy_kind_of_direction("DEVICE_TO_DEVICE"), Some("DtoD"));
    assert_eq!(copy_kind_of_direction("DEVICE_TO_HOST"), Some("DtoH"));
    assert_eq!(copy_kind_of_direction("sideways"), None);
}

/// `args` keeps the members whose value is not already, exactly, in a column: a plain integer
/// (or array of three) that went into `correlation`, `device`, `stream`, `bytes`, `registers`,
/// `shared_mem` or the geometry is left out; strings, floats, values out of a column's range,
/// arrays of another length, keys of other kinds' columns and repeated keys stay as written.
#[test]
fn args_keep_what_no_column_holds() {
    let t = parse_str(
        r#"{"traceEvents": [
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"External id": 3, "cbid": 211, "correlation": 7}},
  {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 1, "args": {"stream": "0x0", "correlation": 8}},
  {"ph": "X", "cat": "kernel", "name": "k_plain", "pid": 0, "tid": 7, "ts": 10, "dur": 1, "args": {"queued": 0, "device": 0, "stream": 7, "correlation": 7, "registers per thread": 32, "shared memory": 0, "grid": [
      4096,
      1,
      1
    ], "block": [128, 1, 1], "est. achieved occupancy %": 26}},
  {"ph": "X", "cat": "kernel", "name": "k_odd", "pid": 0, "tid": 7, "ts": 20, "dur": 1, "args": {"device": "0", "stream": 7.0, "correlation": 8, "registers per thread": 4294967296, "grid": [1, 2], "block": [1, 1, 1, 1]}},
  {"ph": "X", "cat": "kernel", "name": "k_twice", "pid": 0, "tid": 7, "ts": 30, "dur": 1, "args": {"correlation": 9, "stream": 7, "correlation": 10}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 20, "ts": 40, "dur": 1, "args": {"device": 0, "stream": 20, "correlation": 11, "bytes": 4096, "memory bandwidth (GB/s)": 1.5}},
  {"ph": "X", "cat": "kernel", "name": "k_all", "pid": 0, "tid": 7, "ts": 50, "dur": 1, "args": {"device": 0, "correlation": 12}},
  {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 60, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 1024}}
]}"#,
    )
    .unwrap();
    let b = resolved(t);
    let args = strings(&b, "args");
    let args_of = |name: &str| args[row_of(&b, name)].clone().unwrap_or_default();
    assert_eq!(
        args_of("cudaLaunchKernel"),
        r#"{"External id": 3, "cbid": 211}"#
    );
    // A host call's stream is no column; a hex string is no plain integer either.
    assert_eq!(args_of("hipLaunchKernel"), r#"{"stream": "0x0"}"#);
    assert_eq!(
        args_of("k_plain"),
        r#"{"queued": 0, "est. achieved occupancy %": 26}"#
    );
    assert_eq!(
        args_of("k_odd"),
        r#"{"device": "0", "stream": 7.0, "registers per thread": 4294967296, "grid": [1, 2], "block": [1, 1, 1, 1]}"#
    );
    assert_eq!(
        args_of("k_twice"),
        r#"{"correlation": 9, "stream": 7, "correlation": 10}"#
    );
    assert_eq!(
        args_of("Memcpy HtoD (Pageable -> Device)"),
        r#"{"memory bandwidth (GB/s)": 1.5}"#
    );
    assert_eq!(args_of("k_all"), "{}");
    assert_eq!(
        args_of("[memory]"),
        r#"{"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 1024}"#
    );
    // The columns hold what left the text.
    let row = row_of(&b, "k_plain");
    for (column, value) in [
        ("device", 0),
        ("stream", 7),
        ("correlation", 7),
        ("registers", 32),
        ("shared_mem", 0),
        ("grid_x", 4096),
        ("grid_y", 1),
        ("block_x", 128),
    ] {
        assert_eq!(ints(&b, column)[row], Some(value), "{column}");
    }
    let memcpy = row_of(&b, "Memcpy HtoD (Pageable -> Device)");
    assert_eq!(ints(&b, "bytes")[memcpy], Some(4096));
    assert_eq!(
        ints(&b, "correlation")[row_of(&b, "cudaLaunchKernel")],
        Some(7)
    );
}

#[test]
fn a_trace_without_kernels_parses() {
    let t = parse_str(r###"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}"###).unwrap();
    assert_eq!(t.kernels, 0);
    assert_eq!(t.events, 1);
    let t = parse_str(r###"{"traceEvents": []}"###).unwrap();
    assert_eq!(t.events, 0);
}

#[test]
fn reports_bad_input_with_position() {
    let truncated = &MODERN[..MODERN.find("graph_k").unwrap()];
    let e = parse_str(truncated).unwrap_err();
    assert!(e.message.contains("truncated"), "{e}");
    assert!(
        e.offset().unwrap() > 0 && e.offset().unwrap() <= truncated.len() as u64,
        "{e}"
    );

    let e = parse_str(r###"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "X", "name": "b", "ts": "abc", "dur": 1}]}"###).unwrap_err();
    assert_eq!(e.event(), Some(1), "{e}");
    assert!(e.message.contains("\"ts\""), "{e}");
    assert!(e.to_string().contains("event #1"), "{e}");

    let e = parse_str(r###"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b", "ts": 2}]}"###).unwrap_err();
    assert!(e.message.contains("has a \"dur\""), "{e}");

    let e = parse_str(r###"{"displayTimeUnit": "ms"}"###).unwrap_err();
    assert!(e.message.contains("traceEvents"), "{e}");
    assert!(parse_str("").unwrap_err().message.contains("empty"));
    assert!(parse_str("[1, 2]")
        .unwrap_err()
        .message
        .contains("expected an event object"));
    assert!(parse_str("\"text\"")
        .unwrap_err()
        .message
        .contains("expected a JSON object or array"));
    assert!(parse_str("\u{1}\u{2}binary")
        .unwrap_err()
        .message
        .contains("binary"));
    let e = parse_str(
        r###"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1} {"ph": "X"}]}"###,
    )
    .unwrap_err();
    assert!(e.message.contains("expected ',' or ']'"), "{e}");
    assert_eq!(e.event(), Some(1));
    let e = parse_str(
        r###"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": 5}]}"###,
    )
    .unwrap_err();
    assert!(e.message.contains("args"), "{e}");
}

#[test]
fn events_of_skipped_phases_are_not_decoded() {
    // Flows and metadata written "ph" first are passed over: they add no rows.
    let flows = r###"{"traceEvents": [
        {"ph": "s", "id": 1, "pid": 10, "tid": 11, "ts": 1.5, "cat": "ac2g", "name": "ac2g"},
        {"ph":"f", "id": 1, "pid": 0, "tid": 7, "ts": 2, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph" : "t", "id": 1, "ts": 3},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}"###;
    let skipped = |event: &[u8]| of_skipped_phase(Cursor::new(event));
    assert!(skipped(br#"{"ph":"s", "id": 1}"#));
    assert!(skipped(br#"{"ph" :  "M", "name": "process_name"}"#));
    assert!(!skipped(br#"{"ph": "X", "id": 1}"#));
    assert!(!skipped(br#"{"id": 1, "ph": "s"}"#));
    assert!(!skipped(br#"{"ph": "s", "id": 1, "ph": "X"}"#));
    let t = parse_str(flows).unwrap();
    assert_eq!(strings(&resolved(t), "name"), vec![Some("a".to_string())]);

    // Checked as far as the splitter checks every event, as unread args objects are: a string
    // that does not end is an error; a bad token inside is not looked at.
    let e = parse_str(r###"{"traceEvents": [{"ph": "s", "id": 1, "name": "ac2g}]}"###).unwrap_err();
    assert!(e.message.contains("truncated"), "{e}");
    assert!(parse_str(r###"{"traceEvents": [{"ph": "s", "id": 12x, "ts": 1}]}"###).is_ok());
    // Not written "ph" first, or with a "ph" that is not a string: the full parse, which
    // checks every token.
    let e = parse_str(r###"{"traceEvents": [{"id": 12x, "ph": "s", "ts": 1}]}"###).unwrap_err();
    assert!(e.message.contains("expected ',' or '}'"), "{e}");
    let e = parse_str(r###"{"traceEvents": [{"ph": 7, "id": 1}]}"###).unwrap_err();
    assert!(e.message.contains("\"ph\" is a number"), "{e}");

    // A later "ph" overrides the first, as in the full parse.
    let t = parse_str(
        r###"{"traceEvents": [{"ph": "s", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "ph": "X"}]}"###,
    )
    .unwrap();
    assert_eq!(
        strings(&resolved(t), "kind"),
        vec![Some("cpu_op".to_string())]
    );
}

#[test]
fn counts_impossible_values_as_warnings_and_keeps_them() {
    let t = parse_str(
        r###"{"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": -3},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 7200000000},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 1}
    ]}"###,
    )
    .unwrap();
    assert_eq!(t.events, 4);
    assert_eq!(t.warnings["negative durations (kept as-is)"], 1);
    assert_eq!(t.warnings["implausibly long durations (kept as-is)"], 1);
    assert_eq!(
        t.warnings["complete events without dur (stored with dur 0)"],
        1
    );
}

#[test]
fn blocks_split_anywhere_give_the_same_result() {
    // Many events so that the splitter crosses buffer and block boundaries.
    let mut text = String::from("{\"traceEvents\": [\n");
    for i in 0..20_000 {
        if i > 0 {
            text.push_str(",\n");
        }
        text.push_str(&format!(
            "{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k{}\", \"pid\": 0, \"tid\": 7, \"ts\": {}.{:03}, \"dur\": 1.5, \"args\": {{\"correlation\": {i}, \"note\": \"a \\\"quoted\\\" }} brace\"}}}}",
            i % 7,
            1_000_000 + i,
            i % 1000
        ));
    }
    text.push_str("]}");
    let reader = std::io::BufReader::with_capacity(777, text.as_bytes());
    let t = parse(reader, &|_| {}).unwrap();
    assert_eq!(t.events, 20_000);
    let b = resolved(t);
    let ts = ints(&b, "ts");
    let mut sorted: Vec<i64> = ts.iter().map(|v| v.unwrap()).collect();
    sorted.sort();
    assert_eq!(sorted[0], 1_000_000_000);
    assert_eq!(sorted[19_999], 1_019_999_999);
    assert_eq!(
        ints(&b, "dur").iter().map(|v| v.unwrap()).sum::<i64>(),
        20_000 * 1500
    );
}

#[test]
fn blocks_parsed_side_by_side_keep_file_order_and_report_the_failing_event() {
    // Over 16 MB: several read blocks, parsed two at a time.
    let event = |i: usize, ts: &str| {
        format!(
            "{{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"op{}\", \"pid\": 1, \"tid\": 1, \"ts\": {ts}, \"dur\": 1, \"args\": {{\"External id\": {i}, \"pad\": \"{}\"}}}}",
            i % 5,
            "x".repeat(100)
        )
    };
    let events = 150_000;
    let mut text = String::from("{\"traceEvents\": [\n");
    for i in 0..events {
        if i > 0 {
            text.push_str(",\n");
        }
        text.push_str(&event(i, &format!("{}", 1000 + i)));
    }
    text.push_str("]}");
    assert!(text.len() > 2 * (16 << 20), "{} bytes", text.len());
    let t = parse(text.as_bytes(), &|_| {}).unwrap();
    assert_eq!(t.events, events as u64);
    // Rows in file order: ts rises along the batches as the events did.
    let ts: Vec<i64> = t
        .batches
        .iter()
        .flat_map(|b| ints(b, "ts"))
        .map(|v| v.unwrap())
        .collect();
    assert_eq!(ts.len(), events);
    assert!(ts.windows(2).all(|w| w[1] == w[0] + 1000), "out of order");

    // A bad event in a later block: its index and a position inside it.
    let bad = 140_000;
    let good = event(bad, &format!("{}", 1000 + bad));
    let start = text.find(&good).unwrap();
    let text = text.replacen(&good, &event(bad, "\"later\""), 1);
    let e = parse(text.as_bytes(), &|_| {}).unwrap_err();
    assert_eq!(e.event(), Some(bad as u64), "{e}");
    let offset = e.offset().unwrap() as usize;
    assert!(
        offset >= start && offset < start + good.len() + 4,
        "{e}: event at {start}"
    );
    assert!(e.message.contains("\"ts\""), "{e}");
}

/// Each fixture cut at every byte, and with one byte replaced at every position (by a
/// bracket, quote, backslash, digit, invalid UTF-8, ...): every one parses or fails without a
/// panic (the block parser would turn a panic into an error, so its message is checked too),
/// an error names a position inside the text, and every cut before the closing brace fails.
#[test]
fn every_truncation_and_corrupted_byte_is_an_error_not_a_panic() {
    const SUBSTITUTES: &[u8] = b"\"{}[],:\\\xff9e-. x\n";
    let check = |bytes: &[u8], case: &dyn Fn() -> String| -> Option<TraceError> {
        let outcome = std::panic::catch_unwind(|| parse(bytes, &|_| {}))
            .unwrap_or_else(|_| panic!("panicked on {}", case()));
        let e = outcome.err()?;
        assert!(!e.message.contains("panicked"), "{}: {e}", case());
        if let Some(offset) = e.offset() {
            assert!(offset <= bytes.len() as u64, "{}: {e}", case());
        }
        Some(e)
    };
    let mut errors = 0;
    for (name, fixture) in [("MODERN", MODERN), ("LEGACY", LEGACY), ("ROCM", ROCM)] {
        let text = fixture.as_bytes();
        let closing = fixture.rfind('}').unwrap();
        for cut in 0..=closing {
            let e = check(&text[..cut], &|| format!("{name} cut at {cut}"));
            assert!(e.is_some(), "{name} cut at {cut} parsed as a whole trace");
        }
        for (i, &original) in text.iter().enumerate() {
            let substitute = SUBSTITUTES[i % SUBSTITUTES.len()];
            if substitute == original {
                continue;
            }
            let mut corrupted = text.to_vec();
            corrupted[i] = substitute;
            let case = || format!("{name} with byte {i} set to {:?}", substitute as char);
            errors += check(&corrupted, &case).is_some() as usize;
        }
    }
    // Most single-byte changes break the JSON; some (a digit in a number, a letter in a
    // name) leave a valid trace.
    assert!(errors > 1000, "only {errors} corrupted traces failed");
}

/// The JSON Array Format as PyTorch up to 1.7 (`export_chrome_trace`) wrote it: no `cat`,
/// operators under `"pid": "CPU functions"`, kernels under `"CUDA functions"` with the device
/// as `tid`, decimal microseconds, flow arrows `s`/`f`.
const LEGACY_ARRAY: &str = r###"[{"name": "aten::conv2d", "ph": "X", "ts": 1623142623531.500, "dur": 120.250, "tid": 25738, "pid": "CPU functions", "args": {}}, {"name": "aten::conv2d", "ph": "s", "ts": 1623142623531.500, "tid": 25738, "pid": "CPU functions", "id": 0, "cat": "cpu_to_cuda", "args": {}}, {"name": "conv2d_kernel", "ph": "f", "ts": 1623142623600.125, "tid": 1, "pid": "CUDA functions", "id": 0, "cat": "cpu_to_cuda", "args": {}}, {"name": "conv2d_kernel", "ph": "X", "ts": 1623142623600.125, "dur": 45.003, "tid": 1, "pid": "CUDA functions", "args": {}}, {"name": "aten::relu", "ph": "X", "ts": 1623142623700, "dur": 3, "tid": 25738, "pid": "CPU functions", "args": {}}]"###;

#[test]
fn reads_the_json_array_format_of_legacy_pytorch() {
    let t = parse_str(LEGACY_ARRAY).unwrap();
    assert_eq!(t.events, 3);
    assert_eq!(t.kernels, 1);
    let b = resolved(t);
    let k = row_of(&b, "conv2d_kernel");
    assert_eq!(strings(&b, "kind")[k].as_deref(), Some("kernel"));
    assert_eq!(ints(&b, "ts")[k], Some(1_623_142_623_600_125));
    assert_eq!(ints(&b, "dur")[k], Some(45_003));
    assert_eq!(ints(&b, "device")[k], Some(1));
    assert_eq!(ints(&b, "stream")[k], None);
    // Its flow arrow links it to the operator that launched it.
    assert_eq!(strings(&b, "op")[k].as_deref(), Some("aten::conv2d"));
    let op = row_of(&b, "aten::conv2d");
    assert_eq!(strings(&b, "kind")[op].as_deref(), Some("cpu_op"));
    assert_eq!(ints(&b, "tid")[op], Some(25738));
    assert_eq!(ints(&b, "dur")[op], Some(120_250));

    // The format allows the closing `]` to be missing (a trace never closed), after a whole
    // event and maybe a comma: the same events.
    let open = LEGACY_ARRAY.trim_end_matches(']');
    for text in [
        open.to_string(),
        format!("{open},\n"),
        format!("  {LEGACY_ARRAY}\n"),
    ] {
        let t = parse_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!((t.events, t.kernels), (3, 1), "{text}");
    }
    // An event cut short is still a truncated trace, and nothing may follow the array.
    let cut = &LEGACY_ARRAY[..LEGACY_ARRAY.find("aten::relu").unwrap()];
    let e = parse_str(cut).unwrap_err();
    assert!(e.message.contains("truncated"), "{e}");
    assert_eq!(e.event(), Some(4), "{e}");
    let e = parse_str(&format!("{LEGACY_ARRAY} x")).unwrap_err();
    assert!(e.message.contains("after the array"), "{e}");
    assert!(parse_str("[").unwrap_err().message.contains("truncated"));
    assert_eq!(parse_str("[]").unwrap().events, 0);
}

/// Unified-memory page migrations get copy kinds of their own, not those of copies.
#[test]
fn unified_memory_migrations_have_their_own_copy_kind() {
    let text = r###"{"traceEvents": [
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy Unified HtoD", "pid": 0, "tid": 0, "ts": 10, "dur": 2, "args": {"device": 0, "bytes": 65536}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "[CUDA Unified Memory memcpy DtoH]", "pid": 0, "tid": 0, "ts": 20, "dur": 2, "args": {"device": 0, "bytes": 4096}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7, "ts": 30, "dur": 2, "args": {"device": 0, "stream": 7, "bytes": 64}}
]}"###;
    let b = resolved(parse_str(text).unwrap());
    let kinds = strings(&b, "copy_kind");
    assert_eq!(
        kinds[row_of(&b, "Memcpy Unified HtoD")].as_deref(),
        Some("UM HtoD")
    );
    assert_eq!(
        kinds[row_of(&b, "[CUDA Unified Memory memcpy DtoH]")].as_deref(),
        Some("UM DtoH")
    );
    assert_eq!(
        kinds[row_of(&b, "Memcpy HtoD (Pinned -> Device)")].as_deref(),
        Some("HtoD")
    );
}

fn parse_with_steps(text: &str, pattern: &str) -> ParsedTrace {
    let re = crate::formats::nsys::step_pattern(pattern).unwrap();
    super::parse_with_steps(text.as_bytes(), &|_| {}, Some(&re)).unwrap()
}

/// A loop of `ranges` (host range names), each launching one kernel, 100 µs apart; the ranges
/// listed out of time order, as blocks of a trace may be.
fn loop_trace(cat: &str, ranges: &[&str]) -> String {
    let mut events = Vec::new();
    for (i, r) in ranges.iter().enumerate().rev() {
        let t = 1000 + 100 * i;
        events.push(format!(r#"{{"ph": "X", "cat": "{cat}", "name": "{r}", "pid": 1, "tid": 1, "ts": {t}, "dur": 90}}"#));
        events.push(format!(r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {}, "dur": 5, "args": {{"correlation": {}}}}}"#, t + 10, 100 + i));
        events.push(format!(r#"{{"ph": "X", "cat": "kernel", "name": "k{i}", "pid": 0, "tid": 7, "ts": {}, "dur": 20, "args": {{"device": 0, "stream": 7, "correlation": {}}}}}"#, t + 20, 100 + i));
    }
    format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n"))
}

fn kernel_steps(b: &RecordBatch) -> Vec<(String, Option<i64>)> {
    let names = strings(b, "name");
    let kinds = strings(b, "kind");
    let steps = ints(b, "step");
    let mut out: Vec<(String, Option<i64>)> = (0..b.num_rows())
        .filter(|&i| kinds[i].as_deref() == Some("kernel"))
        .map(|i| (names[i].clone().unwrap(), steps[i]))
        .collect();
    out.sort();
    out
}

/// `--step-pattern` makes steps of Kineto ranges: numbered by the capture group (scheduler
/// steps), or by occurrence when the pattern has none (a denoising loop's repeated range).
#[test]
fn step_patterns_mark_kineto_steps() {
    let numbered = loop_trace(
        "user_annotation",
        &["scheduler_step 41", "scheduler_step 42", "other"],
    );
    let b = resolved(parse_with_steps(&numbered, r"^scheduler_step (\d+)$"));
    assert_eq!(
        kernel_steps(&b),
        vec![
            ("k0".into(), Some(41)),
            ("k1".into(), Some(42)),
            ("k2".into(), None)
        ]
    );
    // Without the pattern, no step (only ProfilerStep#N is one by default).
    let b = resolved(parse_str(&numbered).unwrap());
    assert!(kernel_steps(&b).iter().all(|(_, s)| s.is_none()));

    // A repeated range without a number: steps 1..N in order of time, whatever the file order.
    let repeated = loop_trace(
        "python_function",
        &["denoise_step", "denoise_step", "denoise_step"],
    );
    let b = resolved(parse_with_steps(&repeated, "^denoise_step$"));
    assert_eq!(
        kernel_steps(&b),
        vec![
            ("k0".into(), Some(1)),
            ("k1".into(), Some(2)),
            ("k2".into(), Some(3))
        ]
    );
    // Kernels never mark steps, whatever their name.
    let t = parse_with_steps(&repeated, "^k");
    assert!(t.host.steps.is_empty());
}

/// Legacy flow arrows link every kernel to its operator wherever blocks and parse chunks cut
/// the file (between an arrow and its kernel too).
#[test]
fn legacy_flows_link_kernels_across_blocks() {
    let n = 6000;
    let mut events = Vec::new();
    for i in 0..n {
        let t = 1_000_000 + 10 * i;
        events.push(format!(r#"{{"name": "op{i}", "ph": "X", "ts": {t}, "dur": 8, "tid": 3, "pid": "CPU functions", "args": {{}}}}"#));
        events.push(format!(r#"{{"name": "op{i}", "ph": "s", "ts": {t}, "tid": 3, "pid": "CPU functions", "id": {i}, "cat": "cpu_to_cuda", "args": {{}}}}"#));
        events.push(format!(r#"{{"name": "k{i}", "ph": "f", "ts": {}, "tid": 0, "pid": "CUDA functions", "id": {i}, "cat": "cpu_to_cuda", "args": {{}}}}"#, t + 5));
        events.push(format!(r#"{{"name": "k{i}", "ph": "X", "ts": {}, "dur": 2, "tid": 0, "pid": "CUDA functions", "args": {{}}}}"#, t + 5));
    }
    let text = format!("[{}]", events.join(", "));
    let reader = std::io::BufReader::with_capacity(777, text.as_bytes());
    let b = resolved(parse(reader, &|_| {}).unwrap());
    let (names, ops, kinds) = (strings(&b, "name"), strings(&b, "op"), strings(&b, "kind"));
    let mut linked = 0;
    for i in 0..b.num_rows() {
        if kinds[i].as_deref() == Some("kernel") {
            let name = names[i].as_deref().unwrap();
            assert_eq!(
                ops[i].as_deref(),
                Some(format!("op{}", &name[1..]).as_str()),
                "{name}"
            );
            linked += 1;
        }
    }
    assert_eq!(linked, n);
}

/// A trace of `n` operators, each with `args` the parser stores without reading, and a flow
/// arrow (a phase the parser skips) after each.
fn operators_with_flows(n: usize) -> String {
    let events: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"ph": "X", "cat": "cpu_op", "name": "aten::op{i}", "pid": 1, "tid": 2, "ts": {ts}, "dur": 5, "args": {{"External id": {i}, "Input type": ["float", "c10::Half"], "Input Dims": [[2, 3], []]}}}},
  {{"ph": "s", "id": {i}, "pid": 1, "tid": 2, "ts": {ts}, "cat": "ac2g", "name": "ac2g"}}"#,
                ts = 100 + 10 * i
            )
        })
        .collect();
    format!("{{\"traceEvents\": [\n  {}\n]}}", events.join(",\n  "))
}

/// Two damaged quotes in different events make everything between them one string inside the
/// first one's `args` (or inside a skipped flow event), which the bracket scan then takes as
/// part of that event: the events in between must be an error, never silently gone. Two
/// damaged quotes inside one value leave every event in place.
#[test]
fn events_between_two_damaged_quotes_are_an_error_never_lost() {
    let text = operators_with_flows(12);
    assert_eq!(parse_str(&text).unwrap().events, 12);
    // Each string value the parser does not read: (opening quote, closing quote).
    let strings: Vec<(usize, usize)> = ["\"float\"", "\"ac2g\""]
        .iter()
        .flat_map(|s| text.match_indices(s).map(|(i, m)| (i, i + m.len() - 1)))
        .collect();
    let (mut errors, mut at_boundary) = (0, 0);
    for &(open, _) in &strings {
        for &(_, close) in &strings {
            if close < open {
                continue;
            }
            let mut damaged = text.clone().into_bytes();
            damaged[open] = b'X';
            damaged[close] = b'X';
            let case = format!("quotes at {open} and {close} damaged");
            match parse(&damaged[..], &|_| {}) {
                Ok(t) => {
                    assert_eq!(t.events, 12, "{case}: events lost without an error");
                    // Both damages in one value: nothing can be between them.
                    assert!(
                        !text[open..close].contains("}, {") && !text[open..close].contains("},\n"),
                        "{case}: parsed"
                    );
                }
                Err(e) => {
                    errors += 1;
                    // The event-boundary check names the first damaged byte; other checks
                    // fail where the broken structure shows, possibly past both.
                    if e.message.contains("damaged event") {
                        at_boundary += 1;
                        let at = e.offset().unwrap();
                        assert!(at >= open as u64 && at <= close as u64, "{case}: {e}");
                    }
                }
            }
        }
    }
    assert!(errors > 200, "only {errors} damaged traces failed");
    // Most are found by the event-boundary check; before it, they parsed with events lost.
    assert!(at_boundary > 100, "{at_boundary} of {errors}");
}

/// What the damage check must let through: `args` whose strings or arrays of objects hold
/// `}, {`, which is how one event ends and the next begins.
#[test]
fn args_holding_what_looks_like_an_event_boundary_parse() {
    let text = r###"{"traceEvents": [
  {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 2, "ts": 1, "dur": 5, "args": {"shapes": [{"x": 1}, {"y": 2}], "text": "}, {"}},
  {"ph": "s", "id": 1, "pid": 1, "tid": 2, "ts": 1, "cat": "ac2g", "name": "}, {"},
  {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 2, "ts": 9, "dur": 5}
]}"###;
    let t = parse_str(text).unwrap();
    assert_eq!(t.events, 2);
    let b = resolved(t);
    let args = strings(&b, "args");
    assert_eq!(
        args[row_of(&b, "a")].as_deref(),
        Some(r#"{"shapes": [{"x": 1}, {"y": 2}], "text": "}, {"}"#)
    );
}

/// Times are 64-bit nanoseconds end to end: a `baseTimeNanoseconds` that would carry an event
/// past that range, or a `ts + dur` past it, is an error naming where, never a wrapped time.
#[test]
fn times_past_the_64_bit_range_are_an_error_not_a_wrap() {
    let trace = |base: &str, ts: &str, dur: &str| {
        format!(
            r#"{{"traceEvents": [{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {ts}, "dur": {dur}, "args": {{"device": 0, "stream": 7}}}}, {{"ph": "C", "name": "mem", "pid": 0, "ts": 1, "args": {{"v": 1}}}}], "baseTimeNanoseconds": {base}}}"#
        )
    };
    // Near the limit, but every time fits: stored as given.
    let fits = (i64::MAX - 2_000).to_string();
    let t = parse_str(&trace(&fits, "1", "1")).unwrap();
    let b = resolved(t);
    assert_eq!(ints(&b, "ts"), vec![Some(i64::MAX - 1_000)]);

    let over = (i64::MAX - 1_500).to_string();
    let text = trace(&over, "1", "1");
    let e = parse_str(&text).unwrap_err();
    assert!(e.message.contains("baseTimeNanoseconds"), "{e}");
    assert_eq!(e.offset(), Some(text.find(&over).unwrap() as u64), "{e}");

    // ts + dur past the limit, without a time base.
    let text = trace("0", "9223372036854775", "1000");
    let e = parse_str(&text).unwrap_err();
    assert!(e.message.contains("ts + dur"), "{e}");
    assert_eq!(e.event(), Some(0), "{e}");

    // A negative base that would carry a time below the range.
    let e = parse_str(&trace(&i64::MIN.to_string(), "-1", "1")).unwrap_err();
    assert!(e.message.contains("baseTimeNanoseconds"), "{e}");
}

/// A reader of `{"traceEvents": [{"ph": "X", "name": "` and then `len` bytes of `a`, made as
/// it is read; counts what was read.
struct EndlessName {
    head: &'static [u8],
    left: u64,
    read: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::io::Read for EndlessName {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = if !self.head.is_empty() {
            let n = self.head.len().min(buf.len());
            buf[..n].copy_from_slice(&self.head[..n]);
            self.head = &self.head[n..];
            n
        } else {
            let n = (self.left.min(buf.len() as u64)) as usize;
            buf[..n].fill(b'a');
            self.left -= n as u64;
            n
        };
        self.read
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Names and `args` past their limits are bad input naming the event, and an event of
/// gigabytes is refused after reading a bounded part of it, not after the whole.
#[test]
fn oversized_names_and_args_are_an_error_found_early() {
    use crate::columns::{MAX_ARGS_BYTES, MAX_NAME_BYTES};
    let event = |name: &str, args: &str| {
        format!(
            r#"{{"traceEvents": [{{"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1, "dur": 1}}, {{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": 2, "dur": 1, "args": {{"a": "{args}"}}}}]}}"#
        )
    };
    let at_limit = "n".repeat(MAX_NAME_BYTES);
    assert_eq!(parse_str(&event(&at_limit, "")).unwrap().events, 2);
    let e = parse_str(&event(&format!("{at_limit}n"), "")).unwrap_err();
    assert!(e.message.contains("names are limited to 1 MiB"), "{e}");
    assert_eq!(e.event(), Some(1), "{e}");

    let args = "x".repeat(MAX_ARGS_BYTES);
    let e = parse_str(&event("k", &args)).unwrap_err();
    assert!(e.message.contains("args are limited to 16 MiB"), "{e}");
    assert_eq!(e.event(), Some(1), "{e}");

    // A 4 GiB name, made as it is read: refused after a bounded read.
    let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = EndlessName {
        head: br#"{"traceEvents": [{"ph": "X", "name": ""#,
        left: 4 << 30,
        read: read.clone(),
    };
    let e = parse(reader, &|_| {}).unwrap_err();
    assert!(e.message.contains("an event longer than 32 MiB"), "{e}");
    assert_eq!(e.offset(), Some(17), "{e}");
    let read = read.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read < 100 << 20, "read {read} bytes of a 4 GiB event");
}
