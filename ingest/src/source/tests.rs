//! Opening, decompressing, hashing and detecting trace files.

use super::*;

/// The stored hash is XXH3-128 as other tools compute it (reference values from the
/// `xxhash` Python package), whether the bytes streamed past the parser or the file was
/// hashed on its own.
#[test]
fn content_hashes_are_xxh3_128_of_the_raw_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(
        hash_file(&empty).unwrap(),
        "99aa06d3014798d86001c324468d497f"
    );
    let text = dir.path().join("t.txt");
    std::fs::write(&text, b"gpuq").unwrap();
    assert_eq!(
        hash_file(&text).unwrap(),
        "1277cdd2a79d1b250fb464dd235315b5"
    );

    let trace = dir.path().join("trace.json");
    std::fs::write(
        &trace,
        br#"{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}]}"#,
    )
    .unwrap();
    let source = Source::open(&trace, None).unwrap();
    let before_reading = source.hash().unwrap();
    let mut bytes = Vec::new();
    source.reader().unwrap().read_to_end(&mut bytes).unwrap();
    assert_eq!(source.hash().unwrap(), before_reading);
    assert_eq!(source.hash().unwrap(), hash_file(&trace).unwrap());

    // A compressed trace is identified by its file's bytes, not the decompressed ones.
    let gz = dir.path().join("trace.json.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, &bytes).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let source = Source::open(&gz, None).unwrap();
    source
        .reader()
        .unwrap()
        .read_to_end(&mut Vec::new())
        .unwrap();
    assert_eq!(source.hash().unwrap(), hash_file(&gz).unwrap());
    assert_ne!(source.hash().unwrap(), hash_file(&trace).unwrap());

    // Past 240 bytes XXH3 runs its vectorised stripe loop (AVX2 where the CPU has it), here
    // over three 1 MB reads and a partial one, streamed and whole. Reference value:
    // Python `xxhash.xxh3_128_hexdigest(bytes(i * i % 251 for i in range(3000003)))`.
    let big = dir.path().join("big.bin");
    let content: Vec<u8> = (0..3_000_003u64).map(|i| (i * i % 251) as u8).collect();
    std::fs::write(&big, &content).unwrap();
    let want = "1b2c19f7962f917c4e49ce2adbd40174";
    assert_eq!(hash_file(&big).unwrap(), want);
    // Not a trace, so streamed through a `Source` made by hand.
    let source = Source {
        path: big.clone(),
        files: vec![big.clone()],
        size: content.len() as u64,
        compression: Compression::None,
        format: Format::Kineto,
        read: Arc::new(AtomicU64::new(0)),
        decompressed: Arc::new(AtomicU64::new(0)),
        hasher: Arc::new(Mutex::new(XxHash3_128::new())),
        limit: None,
    };
    let mut read = Vec::new();
    source.reader().unwrap().read_to_end(&mut read).unwrap();
    assert_eq!(read, content);
    assert_eq!(source.hash().unwrap(), want);
}

#[test]
fn a_log_being_written_is_read_and_hashed_to_its_last_complete_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stages.log");
    // Over one 64 KiB block back from the end to the last newline.
    let mut text = b"2026-12-02T10:00:00Z stage=a begin\n".repeat(3);
    text.extend(std::iter::repeat_n(b'x', 100_000));
    std::fs::write(&log, &text).unwrap();
    let complete = 3 * 35;
    let mut source = Source::open(&log, None).unwrap();
    assert_eq!(source.format, Format::StageLog);
    assert!(!source.complete_lines());
    assert_eq!(source.complete_lines_only().unwrap(), complete as u64);
    assert!(source.complete_lines());
    assert_eq!(source.size, complete as u64);
    let prefix_hash = {
        let prefix = dir.path().join("prefix");
        std::fs::write(&prefix, &text[..complete]).unwrap();
        hash_file(&prefix).unwrap()
    };
    assert_eq!(source.hash_unread().unwrap(), prefix_hash);
    let mut read = Vec::new();
    source.reader().unwrap().read_to_end(&mut read).unwrap();
    assert_eq!(read, &text[..complete]);
    assert_eq!(source.hash().unwrap(), prefix_hash);
    // No complete line at all.
    std::fs::write(&log, b"2026-12-02T10:00:00Z stage=a begin").unwrap();
    let mut source = Source::open(&log, None).unwrap();
    assert_eq!(source.complete_lines_only().unwrap(), 0);
}

/// A compressed file that decompresses to more than [`MAX_DECOMPRESSION_RATIO`] times its
/// size is refused while it is read (a 400 MiB name in a zstd file of a few KB), early
/// and with bounded memory; a real trace's ratio (5-30) reads through.
#[test]
fn decompression_bombs_are_refused_while_read() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.json.zst");
    let mut enc = zstd::stream::Encoder::new(std::fs::File::create(&bomb).unwrap(), 3).unwrap();
    std::io::Write::write_all(&mut enc, br#"{"traceEvents": [{"ph": "X", "name": ""#).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..400 {
        std::io::Write::write_all(&mut enc, &chunk).unwrap();
    }
    enc.finish().unwrap();
    let source = Source::open(&bomb, None).unwrap();
    assert_eq!(source.format, Format::Kineto);
    let mut reader = source.reader().unwrap();
    let e = std::io::copy(&mut reader, &mut std::io::sink()).unwrap_err();
    assert!(e.to_string().contains("decompression bomb"), "{e}");
    let read = source.decompressed.load(Ordering::Relaxed);
    assert!(read < 80 << 20, "decompressed {read} bytes before stopping");

    // 100 MiB at an ordinary ratio reads through.
    let fine = dir.path().join("fine.json.zst");
    let mut enc = zstd::stream::Encoder::new(std::fs::File::create(&fine).unwrap(), 1).unwrap();
    let mut state = 1u64;
    let text: Vec<u8> = (0..100 << 20)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let symbols = b"{}aaaaaaaaaaaaaaaaaa\"0123456789";
            symbols[(state >> 58) as usize % symbols.len()]
        })
        .collect();
    std::io::Write::write_all(&mut enc, b"{\"traceEvents\": [], \"x\": \"").unwrap();
    std::io::Write::write_all(&mut enc, &text).unwrap();
    enc.finish().unwrap();
    let ratio = (100 << 20) / std::fs::metadata(&fine).unwrap().len();
    assert!(ratio < MAX_DECOMPRESSION_RATIO / 10, "{ratio}");
    let source = Source::open(&fine, None).unwrap();
    let n = std::io::copy(&mut source.reader().unwrap(), &mut std::io::sink()).unwrap();
    assert!(n > 100 << 20);
}

/// A bare array of events is a Chrome trace (JSON Array Format); `--format kineto` reads
/// any text as one, even where detection sees something else or nothing it knows.
#[test]
fn detects_the_json_array_format_and_kineto_can_be_forced() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let array = write(
        "a.json",
        "\n [ {\"name\": \"k\", \"ph\": \"X\", \"ts\": 1, \"dur\": 2}",
    );
    assert_eq!(detect(&array).unwrap().1, Format::Kineto);
    assert_eq!(detect(&write("e.json", "[]")).unwrap().1, Format::Kineto);
    let numbers = write("n.json", "[1, 2, 3]");
    assert!(matches!(detect(&numbers), Err(DetectError::Unknown(_))));
    let opened = Source::open(&numbers, Some(Format::Kineto)).unwrap();
    assert_eq!(opened.format, Format::Kineto);
    // A CSV forced to Kineto is opened as Kineto (the parser then says it is not JSON);
    // an SQLite file or binary content is never text to read.
    let csv = write("c.csv", "Kind,Agent_Id,Correlation_Id,Start_Timestamp\n");
    assert_eq!(
        Source::open(&csv, Some(Format::Kineto)).unwrap().format,
        Format::Kineto
    );
    let binary = write("b.bin", "\u{1}\u{2}\u{3}");
    assert!(Source::open(&binary, Some(Format::Kineto)).is_err());
    let sqlite = write("s.sqlite", "SQLite format 3\0rest");
    assert!(Source::open(&sqlite, Some(Format::Kineto)).is_err());
}
