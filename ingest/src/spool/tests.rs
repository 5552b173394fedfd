//! The spool's frames, spill and windows, and the window planning it is given.
use super::*;
use datafusion::arrow::array::{new_null_array, Int64Array, StringDictionaryBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
use std::sync::Arc;

/// Spilled frames' checksum: XXH3-64 of the bytes, seeded with XXH3-64 of the header
/// (past 240 bytes through the vectorised stripe loop). Reference value: Python
/// `xxhash.xxh3_64_intdigest(data, seed=xxhash.xxh3_64_intdigest(b"hdr"))`.
#[test]
fn spill_checksums_are_seeded_xxh3_64() {
    let data: Vec<u8> = (0..3_000_003u64).map(|i| (i * i % 251) as u8).collect();
    assert_eq!(checksum(b"hdr", &data), 9462004174363762045);
}

fn batch(start: i64, n: usize, label: &str) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("v", DataType::Int64, false),
        Field::new(
            "d",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
    ]));
    let mut d = StringDictionaryBuilder::<Int32Type>::new();
    for _ in 0..n {
        d.append_value(label);
    }
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(start..start + n as i64)),
            Arc::new(d.finish()),
        ],
    )
    .unwrap()
}

#[test]
fn lz4_chunks_give_back_what_was_written_in_any_pieces() {
    // Bytes that compress (repeated text) and bytes that do not (a xorshift stream).
    let mut x = 88172645463325252u64;
    let mut data: Vec<u8> = b"{\"External id\": 12, \"cbid\": 211}, ".repeat(9000);
    data.extend((0..200_000).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    let lens = [
        0,
        1,
        7,
        LZ4_CHUNK - 1,
        LZ4_CHUNK,
        LZ4_CHUNK + 1,
        3 * LZ4_CHUNK,
        data.len(),
    ];
    for len in lens {
        for piece in [1usize, 1000, LZ4_CHUNK, 5 * LZ4_CHUNK] {
            let want = &data[..len];
            let mut sink = Lz4Chunks::new(0);
            for part in want.chunks(piece) {
                sink.write_all(part).unwrap();
            }
            let (n, bytes) = sink.finish().unwrap();
            assert_eq!(n, len);
            assert_eq!(
                lz4_chunks_decompress(&bytes, n).unwrap(),
                want,
                "{len} by {piece}"
            );
            if len > 0 {
                // Cut short, a wrong length or trailing bytes: errors, not a wrong result.
                assert!(lz4_chunks_decompress(&bytes[..bytes.len() - 1], n).is_err());
                assert!(lz4_chunks_decompress(&bytes, n - 1).is_err());
                let mut longer = bytes.clone();
                longer.push(0);
                assert!(lz4_chunks_decompress(&longer, n).is_err());
            }
        }
    }
    // The repeated text compresses (as one block per chunk, not much worse than whole).
    let text = &data[..data.len() - 200_000];
    let mut sink = Lz4Chunks::new(0);
    sink.write_all(text).unwrap();
    let (_, bytes) = sink.finish().unwrap();
    assert!(
        bytes.len() < text.len() / 10,
        "{} of {}",
        bytes.len(),
        text.len()
    );
}

#[test]
fn a_short_spill_file_is_an_error() {
    let frame = Frame::encode(&batch(0, 100, "x")).unwrap();
    let mut bytes = Vec::new();
    frame.write_to(&mut bytes).unwrap();
    let schema = batch(0, 1, "x").schema();
    let back = Frame::read_from(&mut &bytes[..], &schema).unwrap();
    assert_eq!(back.decode().unwrap().num_rows(), 100);
    for cut in [0, 10, 40, bytes.len() - 1] {
        let err = Frame::read_from(&mut &bytes[..cut], &schema)
            .err()
            .expect("short file");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
    }
    let mut corrupt = bytes.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let err = Frame::read_from(&mut &corrupt[..], &schema)
        .err()
        .expect("a damaged frame is an error");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    // A damaged row count, decompressed length or column set is an error, not a wrong
    // batch or an allocation of that length.
    for field in [0, 1, 3] {
        let mut damaged = bytes.clone();
        damaged[field * 8] ^= 0x40;
        let err = Frame::read_from(&mut &damaged[..], &schema)
            .err()
            .expect("a damaged header is an error");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "field {field}");
    }
    // A damaged length (bytes 16..24 of the header) is a short read, not a huge allocation.
    let mut huge = bytes.clone();
    huge[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let err = Frame::read_from(&mut &huge[..], &schema)
        .err()
        .expect("damaged length");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn all_null_columns_are_left_out_and_come_back() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Int64, true),
        Field::new(
            "d",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
    ]));
    let full = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![None, None, None])),
            Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])),
            new_null_array(schema.field(2).data_type(), 3),
        ],
    )
    .unwrap();
    let frame = Frame::encode(&full).unwrap();
    assert_eq!(frame.present, 0b010);
    let mut bytes = Vec::new();
    frame.write_to(&mut bytes).unwrap();
    let back = Frame::read_from(&mut &bytes[..], &schema)
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(back, full);
}

/// A spool of ten batches of 1000 rows (`v` counting from 0), spilling at `path`.
fn ten_batches(path: &std::path::Path, budget: usize) -> Spool {
    let mut s = Spool::new(path.to_path_buf(), budget);
    for i in 0..10 {
        // Each batch has its own dictionary, as parse tasks produce them.
        s.push(batch(i * 1000, 1000, &format!("name{i}"))).unwrap();
    }
    s
}

#[test]
fn a_replay_reads_every_frame_again_in_order() {
    let dir = tempfile::tempdir().unwrap();
    for budget in [usize::MAX, 0, 4_000] {
        let path = dir.path().join(format!("spool-{budget}"));
        let mut replay = ten_batches(&path, budget).into_replay().unwrap();
        assert!(!path.exists(), "the spill file is unlinked once open");
        let mut values = || -> Vec<i64> {
            replay
                .frames()
                .map(|f| f.unwrap().decode().unwrap())
                .flat_map(|b| {
                    let v = b.column(0).as_any().downcast_ref::<Int64Array>();
                    v.unwrap().values().to_vec()
                })
                .collect()
        };
        assert_eq!(values(), (0..10_000).collect::<Vec<_>>(), "budget {budget}");
        assert_eq!(
            values(),
            (0..10_000).collect::<Vec<_>>(),
            "budget {budget}, again"
        );
    }
}

#[test]
fn spills_past_the_budget_and_returns_everything_in_order() {
    let dir = tempfile::tempdir().unwrap();
    for budget in [usize::MAX, 0, 4_000] {
        let path = dir.path().join(format!("spool-{budget}"));
        let s = ten_batches(&path, budget);
        assert_eq!(s.rows(), 10_000);
        assert_eq!(s.spilled(), budget != usize::MAX, "budget {budget}");
        let back: Vec<RecordBatch> = s
            .drain()
            .unwrap()
            .map(|f| f.unwrap().decode().unwrap())
            .collect();
        let values: Vec<i64> = back
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(values, (0..10_000).collect::<Vec<_>>());
        assert_eq!(back.len(), 10);
        assert!(!path.exists(), "spill file left behind");
    }
}

/// Rows go to the last window starting at or before their (pid, ts); a null pid sorts
/// first; each window gives back its rows in the order pushed, spilled or not.
#[test]
fn windows_take_rows_by_process_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, true),
        Field::new("ts", DataType::Int64, false),
    ]));
    let rows = |pid: Vec<Option<i64>>, ts: Vec<i64>| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(pid)),
                Arc::new(Int64Array::from(ts)),
            ],
        )
        .unwrap()
    };
    for budget in [usize::MAX, 0] {
        let path = dir.path().join(format!("windows-{budget}"));
        let mut s = Spool::new(path.clone(), budget);
        s.set_windows(vec![(1, 100), (2, i64::MIN), (2, 50)], true);
        // One batch across every window, one within a window, one of rows out of order.
        s.push(rows(
            vec![None, Some(1), Some(1), Some(2), Some(2), Some(3)],
            vec![5, 50, 150, 10, 60, 0],
        ))
        .unwrap();
        s.push(rows(vec![Some(1), Some(1)], vec![200, 300]))
            .unwrap();
        s.push(rows(vec![Some(2), Some(1), Some(2)], vec![70, 20, 20]))
            .unwrap();
        let mut windows = s.into_windows().unwrap();
        assert_eq!(
            windows.starts(),
            &[(i64::MIN, i64::MIN), (1, 100), (2, i64::MIN), (2, 50)]
        );
        let mut got = Vec::new();
        for w in 0..windows.len() {
            let pairs: Vec<(Option<i64>, i64)> = windows
                .take(w)
                .unwrap()
                .iter()
                .flat_map(|f| {
                    let b = f.decode().unwrap();
                    let pid = b.column(0).as_primitive::<Int64Type>().clone();
                    let ts = b.column(1).as_primitive::<Int64Type>().clone();
                    (0..b.num_rows())
                        .map(|i| (pid.is_valid(i).then(|| pid.value(i)), ts.value(i)))
                        .collect::<Vec<_>>()
                })
                .collect();
            got.push(pairs);
        }
        assert_eq!(
            got,
            vec![
                vec![(None, 5), (Some(1), 50), (Some(1), 20)],
                vec![(Some(1), 150), (Some(1), 200), (Some(1), 300)],
                vec![(Some(2), 10), (Some(2), 20)],
                vec![(Some(2), 60), (Some(3), 0), (Some(2), 70)],
            ],
            "budget {budget}"
        );
        assert!(!path.exists(), "spill file left behind");
        // By time alone: every row as process 0, a null pid too.
        let mut s = Spool::new(path.clone(), budget);
        s.set_windows(vec![(0, i64::MIN), (0, 50), (0, 150)], false);
        s.push(rows(
            vec![None, Some(1), Some(2), Some(3)],
            vec![5, 150, 60, 50],
        ))
        .unwrap();
        let mut windows = s.into_windows().unwrap();
        let ts: Vec<Vec<i64>> = (0..windows.len())
            .map(|w| {
                windows
                    .take(w)
                    .unwrap()
                    .iter()
                    .flat_map(|f| {
                        let b = f.decode().unwrap();
                        b.column(1).as_primitive::<Int64Type>().values().to_vec()
                    })
                    .collect()
            })
            .collect();
        assert_eq!(ts, vec![vec![], vec![5], vec![60, 50], vec![150]]);
    }
}
