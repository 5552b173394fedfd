use super::*;
use crate::attribute::Resolver;
use crate::formats::Position;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use gpuq_testkit::{ints, strings};

fn fixture_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/rocprof")
        .join(case)
}

fn fixture(case: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir(case))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Parses, collecting what goes to the sink.
fn parse_files(
    files: &[PathBuf],
) -> Result<(ParsedTrace, Vec<RecordBatch>), (PathBuf, TraceError)> {
    let mut batches = Vec::new();
    let trace = parse(files, &mut |b| {
        batches.push(b);
        Ok(())
    })?;
    Ok((trace, batches))
}

/// All events, resolved, as one batch.
fn resolved(case: &str) -> (ParsedTrace, RecordBatch) {
    let (mut trace, batches) = parse_files(&fixture(case)).unwrap();
    let schema = gpuq_engine::schema::events_schema();
    let all = concat_batches(&schema, &batches).unwrap();
    let host = std::mem::take(&mut trace.host);
    // Keep what the tests look at; the resolver consumes the rest.
    trace.host.host_span = host.host_span;
    trace.host.correlation_per_process = host.correlation_per_process;
    trace.host.launches = host.launches.clone();
    let b = Resolver::new(host).resolve(&all, None, 0).unwrap();
    (trace, b)
}

fn rows_of(b: &RecordBatch, name: &str) -> Vec<usize> {
    strings(b, "name")
        .iter()
        .enumerate()
        .filter(|(_, n)| n.as_deref() == Some(name))
        .map(|(i, _)| i)
        .collect()
}

fn row_of(b: &RecordBatch, name: &str) -> usize {
    let rows = rows_of(b, name);
    assert_eq!(rows.len(), 1, "rows named {name}: {rows:?}");
    rows[0]
}

fn args(b: &RecordBatch, row: usize) -> serde_json::Value {
    serde_json::from_str(strings(b, "args")[row].as_deref().unwrap()).unwrap()
}

const ELEM: &str = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::FillFunctor<float> >(at::TensorIteratorBase&, at::native::FillFunctor<float> const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::FillFunctor<float> >(at::TensorIteratorBase&, at::native::FillFunctor<float> const&)::{lambda(int)#1})";
const GEMM: &str = "Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_GRVW8_K1_MIWT2_2";
const QUOTE: &str = "void quote_kernel<\"a, b\", 2>(char const*)";
const B: i64 = 2_414_192_700_000_000;

#[test]
fn modern_kernels_counts_durations_and_geometry() {
    let (t, b) = resolved("modern");
    assert_eq!(t.kernels, 5);
    // 9 HIP calls, 6 marker rows, 5 kernels, 4 copies.
    assert_eq!(t.events, 24);
    assert!(!t.epoch_time, "boot-clock timestamps are not epoch ns");
    assert_eq!(t.time_base_ns, 0);
    let kinds = strings(&b, "kind");
    let durs = ints(&b, "dur");
    let kernel_dur: i64 = (0..b.num_rows())
        .filter(|&i| kinds[i].as_deref() == Some("kernel"))
        .map(|i| durs[i].unwrap())
        .sum();
    assert_eq!(kernel_dur, 100 + 3500 + 20000 + 1000 + 2500);
    let elem = rows_of(&b, ELEM);
    assert_eq!(elem.len(), 2);
    assert_eq!(elem.iter().map(|&i| durs[i].unwrap()).sum::<i64>(), 6000);

    let gemm = row_of(&b, GEMM);
    assert_eq!(ints(&b, "ts")[gemm], Some(B + 32000));
    assert_eq!(durs[gemm], Some(20000));
    assert_eq!(ints(&b, "correlation")[gemm], Some(4));
    assert_eq!(
        ints(&b, "device")[gemm],
        Some(0),
        "Agent 1 = logical node 1 = GPU 0"
    );
    assert_eq!(ints(&b, "stream")[gemm], Some(0), "Stream_Id, not Queue_Id");
    assert_eq!(
        ints(&b, "pid")[gemm],
        Some(4242),
        "from the output's API tables"
    );
    assert_eq!(ints(&b, "tid")[gemm], Some(4242));
    // Grid 7680 x 4 work-items in workgroups of 256: 30 x 4 blocks of 256 threads.
    assert_eq!(ints(&b, "grid_x")[gemm], Some(30));
    assert_eq!(ints(&b, "grid_y")[gemm], Some(4));
    assert_eq!(ints(&b, "grid_z")[gemm], Some(1));
    assert_eq!(ints(&b, "block_x")[gemm], Some(256));
    assert_eq!(ints(&b, "block_y")[gemm], Some(1));
    assert_eq!(ints(&b, "registers")[gemm], Some(128));
    assert_eq!(ints(&b, "shared_mem")[gemm], Some(17408));
    let a = args(&b, gemm);
    assert_eq!(a["Agent_Id"], "Agent 1");
    assert_eq!(a["Queue_Id"], 1);
    assert_eq!(a["Dispatch_Id"], 3);
    assert_eq!(a["Kernel_Id"], 12);
    assert_eq!(a["SGPR_Count"], 96);
    assert_eq!(a["Accum_VGPR_Count"], 128);
    assert_eq!(a["Grid_Size_X"], 7680);
    assert_eq!(a["Workgroup_Size_X"], 256);
    assert!(a.get("Kernel_Name").is_none() && a.get("VGPR_Count").is_none());

    // The name with unescaped quotes and commas, on the second GPU; partial block rounds up.
    let quote = row_of(&b, QUOTE);
    assert_eq!(ints(&b, "device")[quote], Some(1));
    assert_eq!(ints(&b, "stream")[quote], Some(3));
    assert_eq!(ints(&b, "tid")[quote], Some(4250));
    assert_eq!(ints(&b, "grid_x")[quote], Some(2));
    assert_eq!(ints(&b, "block_x")[quote], Some(64));
    assert_eq!(ints(&b, "shared_mem")[quote], Some(512));
    assert_eq!(args(&b, quote)["Scratch_Size"], 1024);
    assert_eq!(ints(&b, "grid_x")[elem[0]], Some(8192));
}

#[test]
fn modern_kernels_are_scoped_by_the_roctx_range_around_their_launch() {
    let (t, b) = resolved("modern");
    assert!(!t.host.correlation_per_process);
    let scope = strings(&b, "scope");
    let op = strings(&b, "op");
    let elem = rows_of(&b, ELEM);
    // Launch 3 (t=20000) is inside "forward" only; launch 8 (t=70000) inside no range of its
    // thread (the process-wide "epoch range" is on thread 0).
    assert_eq!(scope[elem[0]].as_deref(), Some("forward"));
    assert_eq!(scope[elem[1]], None);
    // Launch 4 (t=30000) is inside "layer1" inside "forward": the innermost wins.
    let gemm = row_of(&b, GEMM);
    assert_eq!(scope[gemm].as_deref(), Some("layer1"));
    // Launch 5 is on the worker thread, inside its own range.
    assert_eq!(scope[row_of(&b, QUOTE)].as_deref(), Some("worker step, 1"));
    // No launch in the window: no scope.
    assert_eq!(scope[row_of(&b, "early_kernel")], None);
    // The copy launched by hipMemcpyAsync #2 (t=10000) precedes every range.
    let htod = row_of(&b, "Memcpy HtoD (Host -> Device)");
    assert_eq!(scope[htod], None);
    for i in 0..b.num_rows() {
        assert_eq!(op[i], None, "rocprofv3 has no operators (row {i})");
    }
    // The launch call itself is scoped by its own time and thread.
    let launches = rows_of(&b, "hipLaunchKernel");
    assert_eq!(scope[launches[0]].as_deref(), Some("forward"));
    assert_eq!(strings(&b, "kind")[launches[0]].as_deref(), Some("runtime"));
    // Nested range: its scope is the enclosing one.
    assert_eq!(scope[row_of(&b, "layer1")].as_deref(), Some("forward"));
}

#[test]
fn modern_markers_hip_calls_and_launches() {
    let (t, b) = resolved("modern");
    let kinds = strings(&b, "kind");
    assert_eq!(kinds[row_of(&b, "forward")].as_deref(), Some("annotation"));
    assert_eq!(
        kinds[row_of(&b, "epoch range")].as_deref(),
        Some("annotation")
    );
    assert_eq!(ints(&b, "tid")[row_of(&b, "epoch range")], Some(0));
    let mark = row_of(&b, "checkpoint");
    assert_eq!(kinds[mark].as_deref(), Some("instant"));
    assert_eq!(ints(&b, "dur")[mark], Some(0));
    assert_eq!(
        kinds[row_of(&b, "roctxProfilerPause")].as_deref(),
        Some("other")
    );
    let malloc = row_of(&b, "hipMalloc");
    assert_eq!(kinds[malloc].as_deref(), Some("runtime"));
    assert_eq!(ints(&b, "pid")[malloc], Some(4242));
    assert_eq!(ints(&b, "correlation")[malloc], Some(1));
    assert_eq!(ints(&b, "dur")[malloc], Some(5000));
    assert_eq!(args(&b, malloc)["Domain"], "HIP_RUNTIME_API_EXT");
    assert_eq!(ints(&b, "device")[malloc], None);
    // Host span: from hipMalloc (B) to the end of "epoch range" (B + 100000).
    assert_eq!(t.host.host_span, Some((B, B + 100_000)));
}

#[test]
fn modern_launches_and_annotation_intervals_are_registered() {
    let (t, _) = parse_files(&fixture("modern")).unwrap();
    let mut corr: Vec<i64> = t.host.launches.iter().map(|l| l.correlation).collect();
    corr.sort();
    assert_eq!(corr, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let worker = t.host.threads.get(4242, 4250).unwrap();
    let l5 = t.host.launches.iter().find(|l| l.correlation == 5).unwrap();
    assert_eq!((l5.ts, l5.thread), (B + 40000, worker));
    // Four ranges (the mark and the control call are not intervals), all annotations.
    assert_eq!(t.host.intervals.len(), 4);
    assert!(t.host.intervals.iter().all(|iv| iv.annotation()));
}

#[test]
fn modern_copies_and_device_properties() {
    let (t, b) = resolved("modern");
    let ck = strings(&b, "copy_kind");
    let dev = ints(&b, "device");
    let htod = row_of(&b, "Memcpy HtoD (Host -> Device)");
    assert_eq!(ck[htod].as_deref(), Some("HtoD"));
    assert_eq!(dev[htod], Some(0), "destination GPU");
    assert_eq!(ints(&b, "dur")[htod], Some(6000));
    assert_eq!(ints(&b, "correlation")[htod], Some(2));
    assert_eq!(ints(&b, "stream")[htod], Some(0));
    assert_eq!(
        ints(&b, "bytes")[htod],
        None,
        "rocprofv3 CSVs have no byte counts"
    );
    assert_eq!(args(&b, htod)["Source_Agent_Id"], "Agent 0");
    let dtoh = row_of(&b, "Memcpy DtoH (Device -> Host)");
    assert_eq!(ck[dtoh].as_deref(), Some("DtoH"));
    assert_eq!(
        dev[dtoh],
        Some(0),
        "the source GPU when the destination is the CPU"
    );
    let dtod = row_of(&b, "Memcpy DtoD (Device -> Device)");
    assert_eq!(ck[dtod].as_deref(), Some("DtoD"));
    assert_eq!(dev[dtod], Some(1));
    let none = row_of(&b, "Memcpy MEMORY_COPY_NONE");
    assert_eq!(ck[none].as_deref(), Some("MEMORY_COPY_NONE"));
    assert_eq!(strings(&b, "kind")[none].as_deref(), Some("memcpy"));
    assert_eq!(
        t.warnings
            .get("rocprofv3 copies of unknown direction (copy_kind kept as written)"),
        Some(&1)
    );

    let devices = t.top_level["deviceProperties"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["id"], 0);
    assert_eq!(devices[0]["name"], "AMD Instinct MI300X");
    assert_eq!(devices[0]["gfx_target"], "gfx942");
    assert_eq!(devices[0]["node_id"], 2);
    assert_eq!(devices[1]["id"], 1);
    assert_eq!(devices[1]["node_id"], 3);
    let agents = t.top_level["rocprofv3"]["agent_info"].as_array().unwrap();
    assert_eq!(agents.len(), 3);
    assert_eq!(agents[0]["Agent_Type"], "CPU");
    assert_eq!(agents[1]["Cu_Count"], 304);
}

#[test]
fn rocm_6_3_variant_numeric_agents_and_segment_sizes() {
    let (t, b) = resolved("rocm63");
    assert_eq!(t.kernels, 3);
    assert!(!t.top_level.contains_key("deviceProperties"));
    let add = row_of(
        &b,
        "void addition_kernel<float>(float*, float const*, float const*, int, int)",
    );
    let sub = row_of(
        &b,
        "subtract_kernel(float*, float const*, float const*, int, int)",
    );
    let mul = row_of(
        &b,
        "multiply_kernel(float*, float const*, float const*, int, int)",
    );
    let dev = ints(&b, "device");
    // Without agent_info, GPU agents are numbered as first seen: 2 -> 0, 3 -> 1.
    assert_eq!((dev[add], dev[sub], dev[mul]), (Some(0), Some(0), Some(1)));
    // No Stream_Id column: the queue is the stream.
    assert_eq!(ints(&b, "stream")[sub], Some(2));
    assert_eq!(ints(&b, "dur")[add], Some(16157));
    assert_eq!(ints(&b, "dur")[sub], Some(10464));
    assert_eq!(ints(&b, "dur")[mul], Some(10183));
    assert_eq!(ints(&b, "grid_x")[add], Some(16));
    assert_eq!(ints(&b, "grid_y")[add], Some(1024));
    assert_eq!(ints(&b, "block_x")[add], Some(64));
    assert_eq!(
        ints(&b, "grid_x")[mul],
        Some(4),
        "1000 work-items / 256 rounds up"
    );
    assert_eq!(
        ints(&b, "shared_mem")[sub],
        Some(4096),
        "Group_Segment_Size"
    );
    assert_eq!(ints(&b, "registers")[sub], None);
    let a = args(&b, sub);
    assert_eq!(a["Private_Segment_Size"], 16);
    assert_eq!(a["Agent_Id"], 2);
    assert!(a.get("Queue_Id").is_none() && a.get("Group_Segment_Size").is_none());
    assert_eq!(ints(&b, "pid")[sub], Some(1234));
    // Attributed to their hipLaunchKernel (no ranges: no scope, but matched by correlation).
    assert_eq!(strings(&b, "scope")[sub], None);
    // Copies: GPU side by direction.
    let htod = row_of(&b, "Memcpy HtoD (Host -> Device)");
    let dtoh = row_of(&b, "Memcpy DtoH (Device -> Host)");
    assert_eq!(dev[htod], Some(0));
    assert_eq!(dev[dtoh], Some(1), "source agent 3 = GPU 1");
    assert_eq!(ints(&b, "stream")[htod], None);
    assert_eq!(t.host.launches.len(), 5);
}

#[test]
fn missing_optional_columns_are_null_and_standard_escapes_are_read() {
    let (t, b) = resolved("missing_optional");
    assert_eq!(t.kernels, 2);
    assert!(t.epoch_time, "epoch-ns timestamps");
    let k = row_of(&b, "say \"hi\", then go(int)");
    assert_eq!(ints(&b, "ts")[k], Some(1_700_000_000_000_000_100));
    assert_eq!(ints(&b, "dur")[k], Some(250));
    for col in [
        "device",
        "stream",
        "pid",
        "tid",
        "correlation",
        "grid_x",
        "block_x",
        "registers",
        "shared_mem",
    ] {
        assert_eq!(ints(&b, col)[k], None, "{col}");
    }
    assert_eq!(strings(&b, "args")[k], None);
}

#[test]
fn missing_required_column_is_an_error_at_line_1() {
    let files = fixture("missing_column");
    let (path, e) = parse_files(&files).unwrap_err();
    assert_eq!(path, files[0]);
    assert_eq!(e.at, Position::Line(1));
    assert!(e.message.contains("End_Timestamp"), "{}", e.message);
    assert!(
        e.message
            .contains("columns found: Kind, Agent_Id, Queue_Id"),
        "{}",
        e.message
    );
}

#[test]
fn garbled_and_truncated_rows_name_the_line() {
    let files = fixture("garbled");
    let (path, e) = parse_files(&files).unwrap_err();
    assert_eq!(path, files[0]);
    assert_eq!(e.at, Position::Line(4));
    assert!(e.message.contains("Start_Timestamp"), "{}", e.message);
    assert!(e.message.contains("not an integer"), "{}", e.message);

    let files = fixture("truncated");
    let (_, e) = parse_files(&files).unwrap_err();
    assert_eq!(e.at, Position::Line(3));
    assert!(e.message.contains("truncated"), "{}", e.message);
}

fn write_kernel_file(dir: &Path, rows: &str) -> PathBuf {
    let path = dir.join("kernel_trace.csv");
    let header = "\"Kind\",\"Agent_Id\",\"Kernel_Name\",\"Correlation_Id\",\"Start_Timestamp\",\"End_Timestamp\"\n";
    std::fs::write(&path, format!("{header}{rows}")).unwrap();
    path
}

#[test]
fn bad_rows_are_errors_with_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, u64, &str); 5] = [
        // end before start
        ("\"KERNEL_DISPATCH\",\"Agent 1\",\"k\",1,100,50\n", 2, "before"),
        // too few fields, cut after a comma, no line end
        ("\"KERNEL_DISPATCH\",\"Agent 1\",\"k\",1,100,150\n\"KERNEL_DISPATCH\",\"Agent 1\",\"k\",1,", 3, "no line end"),
        // too many fields
        ("\n\"KERNEL_DISPATCH\",\"Agent 1\",\"k\",1,100,150,7\n", 3, "expected 6 fields"),
        // decimal timestamp
        ("\"KERNEL_DISPATCH\",\"Agent 1\",\"k\",1,100.5,150\n", 2, "not an integer"),
        // empty required field
        ("\"KERNEL_DISPATCH\",\"Agent 1\",\"k\",1,100,\n", 2, "End_Timestamp is empty"),
    ];
    for (rows, line, what) in cases {
        let path = write_kernel_file(dir.path(), rows);
        let (p, e) = parse_files(std::slice::from_ref(&path)).unwrap_err();
        assert_eq!(p, path);
        assert_eq!(e.at, Position::Line(line), "{rows:?}: {e}");
        assert!(e.message.contains(what), "{rows:?}: {e}");
    }
    // Not a rocprofv3 CSV at all.
    let other = dir.path().join("other.csv");
    std::fs::write(&other, "name,ts,dur\nk,1,2\n").unwrap();
    let (_, e) = parse_files(&[other]).unwrap_err();
    assert_eq!(e.at, Position::Line(1));
    assert!(e.message.contains("not a rocprofv3 CSV"), "{e}");
    // Binary garbage does not panic.
    let bin = dir.path().join("kernel_trace.csv");
    std::fs::write(&bin, [0xffu8, 0xfe, b'\n', 0, 1, 2]).unwrap();
    assert!(parse_files(&[bin]).is_err());
}

#[test]
fn crlf_bom_and_blank_lines_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernel_trace.csv");
    std::fs::write(
        &path,
        "\u{feff}\"Kind\",\"Kernel_Name\",\"Start_Timestamp\",\"End_Timestamp\"\r\n\"KERNEL_DISPATCH\",\"k\",10,25\r\n\r\n",
    )
    .unwrap();
    let (t, batches) = parse_files(&[path]).unwrap();
    assert_eq!(t.kernels, 1);
    assert_eq!(ints(&batches[0], "dur"), vec![Some(15)]);
}

#[test]
fn processes_match_their_own_launches() {
    let (t, b) = resolved("multiprocess");
    assert!(t.host.correlation_per_process);
    let p100 = row_of(&b, "k_p100");
    let p200 = row_of(&b, "k_p200");
    assert_eq!(ints(&b, "pid")[p100], Some(100));
    assert_eq!(ints(&b, "pid")[p200], Some(200));
    // Both use correlation id 1; only process 200's launch is inside a range.
    assert_eq!(strings(&b, "scope")[p200].as_deref(), Some("rank1 step"));
    assert_eq!(strings(&b, "scope")[p100], None);
}

#[test]
fn table_of_header_recognises_each_table() {
    let first_line = |case: &str, file: &str| {
        let text = std::fs::read_to_string(fixture_dir(case).join(file)).unwrap();
        let mut lines = text.lines();
        (
            lines.next().unwrap().to_string(),
            lines.next().map(String::from),
        )
    };
    let cases = [
        ("modern", "4242_kernel_trace.csv", Table::KernelTrace),
        ("rocm63", "1234_kernel_trace.csv", Table::KernelTrace),
        (
            "modern",
            "4242_memory_copy_trace.csv",
            Table::MemoryCopyTrace,
        ),
        (
            "rocm63",
            "1234_memory_copy_trace.csv",
            Table::MemoryCopyTrace,
        ),
        ("modern", "4242_hip_api_trace.csv", Table::HipApiTrace),
        ("modern", "4242_marker_api_trace.csv", Table::HipApiTrace),
        ("modern", "4242_agent_info.csv", Table::AgentInfo),
        ("missing_optional", "kernel_trace.csv", Table::KernelTrace),
    ];
    for (case, file, table) in cases {
        let (header, _) = first_line(case, file);
        assert_eq!(table_of_header(&header), Some(table), "{case}/{file}");
    }
    let (h, row) = first_line("modern", "4242_marker_api_trace.csv");
    assert_eq!(
        table_of_file(&h, row.as_deref()),
        Some(Table::MarkerApiTrace)
    );
    let (h, row) = first_line("modern", "4242_hip_api_trace.csv");
    assert_eq!(table_of_file(&h, row.as_deref()), Some(Table::HipApiTrace));
    let more = [
        (
            "\"Kind\",\"Operation\",\"Agent_Id\",\"Allocation_Size\",\"Address\",\"Correlation_Id\",\"Start_Timestamp\",\"End_Timestamp\"",
            Some(Table::MemoryAllocationTrace),
        ),
        (
            "\"Kind\",\"Operation\",\"Agent_Id\",\"Queue_Id\",\"Thread_Id\",\"Alloc_Flags\",\"Start_Timestamp\",\"End_Timestamp\"",
            Some(Table::ScratchMemoryTrace),
        ),
        (
            "\"Correlation_Id\",\"Dispatch_Id\",\"Agent_Id\",\"Queue_Id\",\"Process_Id\",\"Thread_Id\",\"Grid_Size\",\"Kernel_Id\",\"Kernel_Name\",\"Workgroup_Size\",\"LDS_Block_Size\",\"Scratch_Size\",\"VGPR_Count\",\"Accum_VGPR_Count\",\"SGPR_Count\",\"Counter_Name\",\"Counter_Value\",\"Start_Timestamp\",\"End_Timestamp\"",
            Some(Table::CounterCollection),
        ),
        (
            "\"Name\",\"Calls\",\"TotalDurationNs\",\"AverageNs\",\"Percentage\",\"MinNs\",\"MaxNs\",\"StdDev\"",
            Some(Table::Stats),
        ),
        // rocpd convert adds a Guid column.
        (
            "\"Guid\",\"Domain\",\"Function\",\"Process_Id\",\"Thread_Id\",\"Correlation_Id\",\"Start_Timestamp\",\"End_Timestamp\"",
            Some(Table::HipApiTrace),
        ),
        // case-insensitive, unquoted
        ("kind,kernel_name,start_timestamp,end_timestamp", Some(Table::KernelTrace)),
        // not rocprofv3
        ("name,ts,dur,device", None),
        ("{\"traceEvents\": [", None),
        ("id,start,end,deviceId,streamId,correlationId,demangledName", None),
        ("", None),
        ("\"unterminated", None),
    ];
    for (header, table) in more {
        assert_eq!(table_of_header(header), table, "{header}");
    }
    assert_eq!(Table::KernelTrace.name(), "kernel_trace");
    assert_eq!(Table::MarkerApiTrace.name(), "marker_api_trace");
}

#[test]
fn splits_rocprofv3_names_with_unescaped_quotes() {
    let mut f = Vec::new();
    let line = "\"KERNEL_DISPATCH\",\"Agent 1\",\"a<\"x, y\">(int)\",5,10,20";
    assert_eq!(split_standard(line, &mut f), Split::Malformed);
    assert!(split_anchored(line, 6, 2, &mut f));
    let got: Vec<String> = f.iter().map(|x| x.text(line).into_owned()).collect();
    assert_eq!(
        got,
        [
            "KERNEL_DISPATCH",
            "Agent 1",
            "a<\"x, y\">(int)",
            "5",
            "10",
            "20"
        ]
    );
    // Standard CSV: doubled quotes, empty fields, trailing empty field.
    let line = "\"a \"\"b\"\", c\",,x,";
    assert_eq!(split_standard(line, &mut f), Split::Complete);
    let got: Vec<String> = f.iter().map(|x| x.text(line).into_owned()).collect();
    assert_eq!(got, ["a \"b\", c", "", "x", ""]);
    // Anchoring fails cleanly on hopeless input.
    for bad in ["", "\"", ",,,\"", "\"a\"b\"", "a,\"b"] {
        assert!(!split_anchored(bad, 6, 2, &mut f), "{bad:?}");
        let _ = split_standard(bad, &mut f);
    }
}

#[test]
fn batches_go_to_the_sink() {
    let mut n = 0usize;
    let mut rows = 0usize;
    let t = parse(&fixture("modern"), &mut |b| {
        n += 1;
        rows += b.num_rows();
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 1);
    assert_eq!(rows as u64, t.events);
    assert!(t.batches.is_empty());
    // A failing sink is an error, not a panic.
    let err = parse(&fixture("modern"), &mut |_| {
        Err(std::io::Error::other("disk full"))
    })
    .unwrap_err();
    assert!(err.1.message.contains("disk full"), "{}", err.1);
}
