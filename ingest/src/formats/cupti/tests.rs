//! Segments in, rows out: names, attribution across segments, held GPU records, warnings.

use super::*;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Int64Type;
use gpuq_cupti_wal::{read_segment, SegmentBuilder};

const T0: i64 = 1_700_000_000_000_000_000;

fn segment(seq: u64, strings: &[(u32, &str)], records: &[RawRecord], health: &str) -> Segment {
    let mut b = SegmentBuilder::new();
    for (id, s) in strings {
        b.string(*id, s.as_bytes());
    }
    for r in records {
        b.record(r);
    }
    let meta = format!(
        "{{\"pid\":42,\"rank\":3,\"host\":\"h\",\"cupti_version\":130001,\"library\":\"x\",\"clock\":{{\"cupti_ns\":{T0},\"realtime_ns\":{T0}}},\"flush_ms\":1000,\"seq\":{seq}}}"
    );
    read_segment(&b.finish(&meta, health)).unwrap()
}

fn launch(corr: u32, ts: i64) -> RawRecord {
    RawRecord {
        kind: RecordKind::Runtime,
        code: 211,
        start: T0 + ts,
        end: T0 + ts + 5,
        pid: 42,
        tid: 7,
        correlation: corr,
        name: 1,
        ..RawRecord::default()
    }
}

fn kernel(corr: u32, ts: i64) -> RawRecord {
    RawRecord {
        kind: RecordKind::Kernel,
        start: T0 + ts,
        end: T0 + ts + 100,
        device: 0,
        stream: 7,
        correlation: corr,
        name: 2,
        grid: [4, 1, 1],
        block: [128, 1, 1],
        registers: 32,
        static_smem: 1024,
        dynamic_smem: 512,
        ..RawRecord::default()
    }
}

fn marker(flags: u32, id: u32, ts: i64, name: u32) -> RawRecord {
    RawRecord {
        kind: RecordKind::Marker,
        code: flags,
        start: T0 + ts,
        end: T0 + ts,
        pid: 42,
        tid: 7,
        value: id,
        name,
        object_kind: 2,
        ..RawRecord::default()
    }
}

const STRINGS: &[(u32, &str)] = &[
    (1, "cudaLaunchKernel_v7000"),
    (2, "_Z6kernelPfi"),
    (3, "ProfilerStep#5"),
    (4, "aten::mm, seq = 3"),
    (5, "forward"),
];

fn column_i64(b: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    b.column_by_name(name)
        .unwrap()
        .as_primitive::<Int64Type>()
        .iter()
        .collect()
}

fn names(b: &RecordBatch, column: &str) -> Vec<Option<String>> {
    let a = datafusion::arrow::compute::cast(
        b.column_by_name(column).unwrap(),
        &datafusion::arrow::datatypes::DataType::Utf8,
    )
    .unwrap();
    a.as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect()
}

#[test]
fn a_kernel_before_its_launch_waits_for_it_and_takes_its_step_op_and_scope() {
    let mut rec = Recording::new(None);
    // Segment 1: the kernel alone (its launch's buffer was not complete yet).
    rec.push(&segment(1, STRINGS, &[kernel(9, 1_000)], ""))
        .unwrap();
    assert!(
        rec.take().events.is_none(),
        "the kernel waits for its launch"
    );
    // Segment 2: the step, operator and scope ranges, and the launch inside them.
    let records = [
        marker(2, 1, 0, 3),
        marker(2, 2, 10, 5),
        marker(2, 3, 20, 4),
        launch(9, 30),
        marker(4, 3, 40, 0),
        marker(4, 2, 50, 0),
        marker(4, 1, 2_000, 0),
    ];
    rec.push(&segment(2, STRINGS, &records, "")).unwrap();
    let taken = rec.take();
    let b = taken.events.unwrap();
    let kinds = names(&b, "kind");
    let k = kinds
        .iter()
        .position(|k| k.as_deref() == Some("kernel"))
        .unwrap();
    assert_eq!(names(&b, "name")[k].as_deref(), Some("kernel(float*, int)"));
    assert_eq!(column_i64(&b, "step")[k], Some(5));
    assert_eq!(names(&b, "op")[k].as_deref(), Some("aten::mm"));
    assert_eq!(names(&b, "scope")[k].as_deref(), Some("forward"));
    assert_eq!(column_i64(&b, "correlation")[k], Some(9));
    assert_eq!(column_i64(&b, "shared_mem")[k], Some(1536));
    assert_eq!(column_i64(&b, "ts")[k], Some(T0 + 1_000));
    assert_eq!(column_i64(&b, "dur")[k], Some(100));
    let args = names(&b, "args")[k].clone().unwrap();
    assert!(args.contains("\"mangled\":\"_Z6kernelPfi\""), "{args}");
    let l = kinds
        .iter()
        .position(|k| k.as_deref() == Some("runtime"))
        .unwrap();
    assert_eq!(names(&b, "name")[l].as_deref(), Some("cudaLaunchKernel"));
    assert_eq!(column_i64(&b, "tid")[l], Some(7));
    // The step is an annotation of scope `step`, the operator a cpu_op.
    let s = names(&b, "name")
        .iter()
        .position(|n| n.as_deref() == Some("ProfilerStep#5"))
        .unwrap();
    assert_eq!(kinds[s].as_deref(), Some("annotation"));
    assert_eq!(column_i64(&b, "dur")[s], Some(2_000));
    assert!(kinds.iter().any(|k| k.as_deref() == Some("cpu_op")));
    let rank = b.column_by_name("rank").unwrap();
    assert_eq!(rank.null_count(), 0);
    assert_eq!(taken.kernels, 1);
    assert!(rec.take_warnings().is_empty());
}

#[test]
fn a_gpu_record_whose_launch_never_comes_is_stored_after_the_hold_and_counted() {
    let mut rec = Recording::new(None);
    rec.push(&segment(1, STRINGS, &[kernel(77, 0)], ""))
        .unwrap();
    for seq in 2..=HOLD_SEGMENTS {
        rec.push(&segment(seq, STRINGS, &[], "")).unwrap();
        assert!(rec.take().events.is_none());
    }
    rec.push(&segment(HOLD_SEGMENTS + 1, STRINGS, &[], ""))
        .unwrap();
    let b = rec.take().events.unwrap();
    assert_eq!(b.num_rows(), 1);
    assert_eq!(column_i64(&b, "step")[0], None);
    let w = rec.take_warnings();
    assert_eq!(w.values().sum::<u64>(), 1, "{w:?}");
}

#[test]
fn drops_are_counters_and_warnings_and_segments_must_come_in_order() {
    let mut rec = Recording::new(None);
    let health = "{\"records\":0,\"dropped_records\":17,\"zero_timestamp_records\":2}";
    rec.push(&segment(4, STRINGS, &[], health)).unwrap();
    let taken = rec.take();
    let c = taken.counters.unwrap();
    assert_eq!(c.num_rows(), 2);
    let w = rec.take_warnings();
    assert!(
        w.iter().any(|(k, v)| k.contains("dropped") && *v == 17),
        "{w:?}"
    );
    let e = rec.push(&segment(4, STRINGS, &[], "")).unwrap_err();
    assert!(e.contains("comes after"), "{e}");
}

#[test]
fn memcpy_memset_and_sync_are_labelled_as_nsys_labels_them() {
    let mut rec = Recording::new(None);
    let records = [
        RawRecord {
            kind: RecordKind::Context,
            context: 5,
            device: 1,
            ..RawRecord::default()
        },
        RawRecord {
            kind: RecordKind::Memcpy,
            copy_kind: 1,
            src_kind: 1,
            dst_kind: 3,
            bytes: 4096,
            start: T0 + 10,
            end: T0 + 20,
            device: 1,
            stream: 3,
            ..RawRecord::default()
        },
        RawRecord {
            kind: RecordKind::Memset,
            bytes: 64,
            start: T0 + 30,
            end: T0 + 31,
            device: 1,
            stream: 3,
            ..RawRecord::default()
        },
        RawRecord {
            kind: RecordKind::Sync,
            code: 3,
            start: T0 + 40,
            end: T0 + 50,
            context: 5,
            stream: 3,
            ..RawRecord::default()
        },
    ];
    rec.push(&segment(1, STRINGS, &records, "")).unwrap();
    let b = rec.take().events.unwrap();
    assert_eq!(
        names(&b, "name"),
        vec![
            Some("[CUDA memcpy Host-to-Device]".to_string()),
            Some("[CUDA memset]".to_string()),
            Some("Stream Sync".to_string())
        ]
    );
    assert_eq!(names(&b, "copy_kind")[0].as_deref(), Some("HtoD"));
    assert_eq!(column_i64(&b, "bytes")[..2], [Some(4096), Some(64)]);
    let args = names(&b, "args")[0].clone().unwrap();
    assert!(
        args.contains("\"src_kind\":\"Pageable\"") && args.contains("\"dst_kind\":\"Device\""),
        "{args}"
    );
    // The sync's device comes from its context.
    let device = b
        .column_by_name("device")
        .unwrap()
        .as_primitive::<Int32Type>();
    assert_eq!(device.value(2), 1);
}

#[test]
fn nested_ranges_that_start_together_are_closed_by_their_own_ids() {
    let mut rec = Recording::new(None);
    // "forward" (id 1) and "aten::mm" (id 2) start at the same ns; the inner one ends first.
    let records = [
        marker(2, 1, 0, 5),
        marker(2, 2, 0, 4),
        marker(4, 2, 50, 0),
        marker(4, 1, 100, 0),
    ];
    rec.push(&segment(1, STRINGS, &records, "")).unwrap();
    let b = rec.take().events.unwrap();
    let names = names(&b, "name");
    let dur = column_i64(&b, "dur");
    let at = |n: &str| names.iter().position(|x| x.as_deref() == Some(n)).unwrap();
    assert_eq!(dur[at("forward")], Some(100));
    assert_eq!(dur[at("aten::mm, seq = 3")], Some(50));
}

#[test]
fn each_process_keeps_its_own_rank() {
    let mut rec = Recording::new(None);
    let seg = |pid: u32, rank: Option<i32>| {
        let mut b = SegmentBuilder::new();
        b.record(&kernel(0, 10));
        let rank = rank.map_or("null".to_string(), |r| r.to_string());
        let meta = format!(
            "{{\"pid\":{pid},\"rank\":{rank},\"clock\":{{\"cupti_ns\":{T0},\"realtime_ns\":{T0}}},\"seq\":1}}"
        );
        read_segment(&b.finish(&meta, "")).unwrap()
    };
    rec.push(&seg(10, Some(1))).unwrap();
    rec.push(&seg(11, None)).unwrap();
    let b = rec.take().events.unwrap();
    let pid = column_i64(&b, "pid");
    let rank = b
        .column_by_name("rank")
        .unwrap()
        .as_primitive::<Int32Type>();
    for i in 0..b.num_rows() {
        match pid[i] {
            Some(10) => assert_eq!(rank.value(i), 1),
            Some(11) => assert!(rank.is_null(i), "a process without a rank takes none"),
            other => panic!("{other:?}"),
        }
    }
}
