use super::*;
use crate::formats::Position;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use gpuq_testkit::{ints, strings};

/// 2026-12-02T10:00:00Z.
const T0: i64 = 1_796_205_600_000_000_000;
const SEC: i64 = 1_000_000_000;

/// Parses `text`; the stages as one batch (empty when nothing reached the sink).
fn run(text: &str, lenient: bool) -> Result<(ParsedTrace, RecordBatch), TraceError> {
    let mut batches = Vec::new();
    let t = parse(text.as_bytes(), lenient, &mut |b| {
        batches.push(b);
        Ok(())
    })?;
    let schema = gpuq_engine::schema::TableKind::Events.file_schema();
    let all = concat_batches(&schema, &batches).unwrap();
    Ok((t, all))
}

fn ok(text: &str) -> (ParsedTrace, RecordBatch) {
    run(text, false).unwrap_or_else(|e| panic!("{e}"))
}

fn err(text: &str) -> TraceError {
    match run(text, false) {
        Ok((t, _)) => panic!("parsed {} stages, expected an error", t.events),
        Err(e) => e,
    }
}

/// `(name, ts, dur)` of every stage, in output order.
fn stages(b: &RecordBatch) -> Vec<(String, i64, i64)> {
    let names = strings(b, "name");
    let ts = ints(b, "ts");
    let dur = ints(b, "dur");
    (0..b.num_rows())
        .map(|i| (names[i].clone().unwrap(), ts[i].unwrap(), dur[i].unwrap()))
        .collect()
}

fn s(name: &str, ts: i64, dur: i64) -> (String, i64, i64) {
    (name.to_string(), ts, dur)
}

#[test]
fn key_value_iso_timestamps_are_exact_to_the_nanosecond() {
    let (t, b) = ok("2026-12-02T10:00:00.123456789Z stage=load begin\n\
         2026-12-02T10:00:01.5Z stage=load end\n");
    assert!(t.epoch_time);
    assert_eq!(t.time_base_ns, 0);
    assert_eq!(t.events, 1);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(
        stages(&b),
        vec![s("load", 1_796_205_600_123_456_789, 1_376_543_211)]
    );
    assert_eq!(strings(&b, "kind"), vec![Some("annotation".to_string())]);
    assert_eq!(strings(&b, "scope"), vec![Some("stage".to_string())]);
    assert_eq!(strings(&b, "args"), vec![None]);
    assert_eq!(ints(&b, "pid"), vec![None]);
}

#[test]
fn utc_offsets_are_applied() {
    // a and c begin at 10:00:00Z; `,` is accepted as the fraction separator.
    let (_, b) = ok("2026-12-02T11:00:00+01:00 stage=a begin\n\
         2026-12-02T04:30:00.25-0530 stage=b begin\n\
         2026-12-03T00:00:00+14 stage=c begin\n\
         2026-12-02T10:00:00,5z stage=d begin\n\
         2026-12-02T10:00:03Z stage=a end\n\
         2026-12-02T10:00:03Z stage=b end\n\
         2026-12-02T10:00:03Z stage=c end\n\
         2026-12-02T10:00:03Z stage=d end\n");
    assert_eq!(
        stages(&b),
        vec![
            s("a", T0, 3 * SEC),
            s("c", T0, 3 * SEC),
            s("b", T0 + SEC / 4, 3 * SEC - SEC / 4),
            s("d", T0 + SEC / 2, 3 * SEC - SEC / 2),
        ]
    );
}

#[test]
fn epoch_timestamps_take_their_unit_from_the_magnitude() {
    assert_eq!(epoch_to_ns("1796205600"), Ok(T0));
    assert_eq!(epoch_to_ns("1796205600.123456"), Ok(T0 + 123_456_000));
    assert_eq!(epoch_to_ns("1796205600.123456789"), Ok(T0 + 123_456_789));
    assert_eq!(epoch_to_ns("1796205600123"), Ok(T0 + 123_000_000));
    assert_eq!(epoch_to_ns("1796205600123.456789"), Ok(T0 + 123_456_789));
    assert_eq!(epoch_to_ns("1796205600123456"), Ok(T0 + 123_456_000));
    assert_eq!(epoch_to_ns("1796205600123456.789"), Ok(T0 + 123_456_789));
    assert_eq!(epoch_to_ns("1796205600123456789"), Ok(T0 + 123_456_789));
    // Just below 10^11 is still seconds (too far in the future for i64 ns); 10^11 is ms.
    assert!(epoch_to_ns("99999999999")
        .unwrap_err()
        .contains("out of range"));
    assert_eq!(epoch_to_ns("100000000000"), Ok(100_000_000_000_000_000));
    assert_eq!(epoch_to_ns("9223372036.854775807"), Ok(i64::MAX));
    assert!(epoch_to_ns("9223372036.854775808").is_err());
    assert!(epoch_to_ns("1796205600.1234567891").is_err());
    assert!(epoch_to_ns("1796205600123456789.5").is_err());
    assert!(epoch_to_ns("99999999999999999999").is_err());
    for bad in ["", ".5", "5.", "-5", "1e9", "1.2.3", "１２"] {
        assert!(epoch_to_ns(bad).is_err(), "{bad}");
    }
    let (_, b) = ok("1796205600.000000001 stage=x begin\n1796205600250 stage=x end\n");
    assert_eq!(stages(&b), vec![s("x", T0 + 1, SEC / 4 - 1)]);
}

#[test]
fn iso_fields_are_range_checked() {
    assert!(timestamp_ns("2028-02-29T00:00:00Z", false, None).is_ok());
    for bad in [
        "2026-02-29T00:00:00Z",
        "2026-13-02T10:00:00Z",
        "2026-04-31T10:00:00Z",
        "2026-12-02T24:00:00Z",
        "2026-12-02T10:60:00Z",
        "2026-12-02T10:00:60Z",
        "2026-12-02T10:00:00+24:00",
        "2026-12-02T10:00:00.1234567890Z",
        "2026-12-02T10:00:00",
        "2026-12-02 10:00:00Z",
        "2026-12-02T10:00Z",
        "3000-01-01T00:00:00Z",
    ] {
        assert!(timestamp_ns(bad, false, None).is_err(), "{bad}");
    }
    assert_eq!(timestamp_ns("2026-12-02 10:00:00Z", true, None), Ok(T0));
    assert_eq!(timestamp_ns("1970-01-01T00:00:00Z", false, None), Ok(0));
    assert_eq!(timestamp_ns("1969-12-31T23:59:59Z", false, None), Ok(-SEC));
    let e = err("2026-12-02T10:00:00 stage=load begin\n");
    assert_eq!(e.at, Position::Line(1));
    assert!(e.message.contains("without a UTC offset"), "{e}");
    assert!(e.message.contains("--tz"), "{e}");
}

/// Parses `text` with naive times local to `zone`: the stages, or the error.
fn in_zone(text: &str, zone: &str) -> Result<Vec<(String, i64, i64)>, TraceError> {
    let zone: zone::LogZone = zone.parse().unwrap();
    let mut batches = Vec::new();
    parse_onto(text.as_bytes(), false, Some(&zone), None, None, &mut |b| {
        batches.push(b);
        Ok(())
    })?;
    let schema = gpuq_engine::schema::TableKind::Events.file_schema();
    Ok(stages(&concat_batches(&schema, &batches).unwrap()))
}

#[test]
fn naive_times_are_local_to_the_given_zone() {
    // 11:00 in Berlin in December is 10:00Z (T0); in July it would be 09:00Z.
    let log = concat!(
        r#"{"ts": "2026-12-02T11:00:00", "stage": "load", "event": "begin"}"#,
        "\n",
        "2026-12-02T11:00:02 stage=load end\n",
        "2026-12-02 11:00:03,500 INFO train: stage=eval begin\n",
        "time=\"2026-12-02 11:00:04\" stage=eval end\n",
        "2026-12-02T10:00:05Z stage=zoned begin\n",
        "1796205606 stage=zoned end\n",
    );
    assert_eq!(
        in_zone(log, "Europe/Berlin").unwrap(),
        vec![
            s("load", T0, 2 * SEC),
            s("eval", T0 + 3 * SEC + SEC / 2, SEC / 2),
            s("zoned", T0 + 5 * SEC, SEC),
        ]
    );
    assert_eq!(
        in_zone(log, "+01:00").unwrap(),
        in_zone(log, "Europe/Berlin").unwrap()
    );
    let summer = "2026-07-02T11:00:00 stage=a begin\n2026-07-02T11:00:01 stage=a end\n";
    let july_9z = T0 - 153 * 86_400 * SEC - SEC * 3600;
    assert_eq!(
        in_zone(summer, "Europe/Berlin").unwrap(),
        vec![s("a", july_9z, SEC)]
    );
    // Python lines without a zone stay UTC; with one they move.
    let py = "2026-12-02 10:00:00,000 INFO t: stage=a begin\n2026-12-02 10:00:01,000 INFO t: stage=a end\n";
    assert_eq!(stages(&ok(py).1), vec![s("a", T0, SEC)]);
    assert_eq!(
        in_zone(py, "-05:30").unwrap(),
        vec![s("a", T0 + 19_800 * SEC, SEC)]
    );
    // A local time the clocks skipped is an error on its line, not a guess.
    let e = in_zone(
        "2026-03-29T01:59:00 stage=a begin\n2026-03-29T02:30:00 stage=a end\n",
        "Europe/Berlin",
    )
    .unwrap_err();
    assert_eq!(e.at, Position::Line(2));
    assert!(e.message.contains("did not happen in Europe/Berlin"), "{e}");
}

#[test]
fn json_lines_read_timestamps_from_the_number_text() {
    let (t, b) = ok(concat!(
        r#"{"ts": 1796205600.123456789, "stage": "load", "event": "begin", "pid": 7, "tid": 8, "rank": 3}"#,
        "\n",
        r#"{"level": "info", "msg": "loading", "ts": 1796205601}"#,
        "\n",
        r#"{"time": "2026-12-02T10:00:02Z", "stage": "load", "event": "END", "pid": 7, "tid": 8, "rank": 3, "bytes": 1024}"#,
        "\n",
        r#"{"timestamp": "1796205603.5", "stage": "eval", "event": "start"}"#,
        "\n",
        r#"{"timestamp": 1796205604000, "stage": "eval", "event": "stop", "extra": {"a": [1, 2]}}"#,
        "\n",
    ));
    assert_eq!(t.events, 2);
    assert_eq!(
        stages(&b),
        vec![
            s("load", T0 + 123_456_789, 2 * SEC - 123_456_789),
            s("eval", T0 + 3 * SEC + SEC / 2, SEC / 2),
        ]
    );
    assert_eq!(ints(&b, "pid"), vec![Some(7), None]);
    assert_eq!(ints(&b, "tid"), vec![Some(8), None]);
    assert_eq!(
        strings(&b, "args"),
        vec![
            Some(r#"{"bytes":1024,"rank":3}"#.to_string()),
            Some(r#"{"extra":{"a":[1,2]}}"#.to_string()),
        ]
    );
}

#[test]
fn json_marker_errors_are_reported() {
    for (line, needle) in [
        (
            r#"{"ts": 1, "time": 2, "stage": "a", "event": "begin"}"#,
            "several timestamp keys",
        ),
        (r#"{"stage": "a", "event": "begin"}"#, "without \"ts\""),
        (r#"{"ts": 1, "stage": "a"}"#, "without an \"event\""),
        (r#"{"ts": 1, "stage": "a", "event": "go"}"#, "is not begin"),
        (
            r#"{"ts": 1, "stage": 5, "event": "begin"}"#,
            "must be a string",
        ),
        (
            r#"{"ts": 1, "stage": "a", "event": "begin", "pid": "x"}"#,
            "must be an integer",
        ),
        (
            r#"{"ts": -1, "stage": "a", "event": "begin"}"#,
            "not a timestamp",
        ),
        (
            r#"{"ts": 1.5e9, "stage": "a", "event": "begin"}"#,
            "not a timestamp",
        ),
        (
            r#"{"ts": "2026-12-02T10:00:00", "stage": "a", "event": "begin"}"#,
            "UTC offset",
        ),
        (
            r#"{"ts": 1, "stage": "a", "event": "begin"} trailing"#,
            "JSON",
        ),
        (r#"{"traceEvents": ["#, "JSON"),
    ] {
        let e = err(&format!("\n{line}\n"));
        assert_eq!(e.at, Position::Line(2), "{line}");
        assert!(e.message.contains(needle), "{line}: {e}");
    }
}

#[test]
fn python_logging_lines_in_both_formats() {
    let (t, b) = ok("2026-12-02 10:00:00,123 INFO train: stage=load begin\n\
         2026-12-02 10:00:00,500 - train - INFO - [stage] load end\n\
         2026-12-02 10:00:01,000 WARNING torch.distributed: something unrelated\n\
         2026-12-02 10:00:01,000 - root - DEBUG - stages are fun\n\
         2026-12-02 11:00:01,250+01:00 - train - INFO - stage \"data prep\" start rank=2\n\
         2026-12-02 10:00:02.75Z INFO train: stage: \"data prep\" done rank=2\n\
         2026-12-02 11:00:03+0100 INFO app.main: stage=eval event=begin\n\
         2026-12-02 10:00:04 INFO app.main: stage=eval event=end\n");
    assert_eq!(t.events, 3);
    assert_eq!(
        stages(&b),
        vec![
            s("load", T0 + 123_000_000, 377_000_000),
            s("data prep", T0 + 1_250_000_000, 1_500_000_000),
            s("eval", T0 + 3 * SEC, SEC),
        ]
    );
    assert_eq!(
        strings(&b, "args")[1].as_deref(),
        Some(r#"{"level":"INFO","logger":"train","rank":2}"#)
    );
    assert_eq!(
        strings(&b, "args")[2].as_deref(),
        Some(r#"{"level":"INFO","logger":"app.main"}"#)
    );
}

#[test]
fn python_logging_marker_errors_are_reported() {
    for (line, needle) in [
        (
            "2026-12-02 10:00:00,123 INFO train: [stage] load",
            "without begin or end",
        ),
        (
            "2026-12-02 10:00:00,123 INFO train: stage data prep begin",
            "unexpected word",
        ),
        ("2026-12-02 10:00:00,123 INFO train: [stage]", "stage name"),
        (
            "2026-12-02 10:00:00,123 INFO: stage=load begin",
            "not in the format",
        ),
        (
            "2026-12-02 10:00:00,123 just some text",
            "not in the format",
        ),
        ("2026-12-02 25:00:00,123 INFO train: hello", "out of range"),
        ("2026-12-02 noon INFO train: hello", "valid time"),
    ] {
        let e = err(&format!("2026-12-02 10:00:00,000 INFO train: ok\n{line}\n"));
        assert_eq!(e.at, Position::Line(2), "{line}");
        assert!(e.message.contains(needle), "{line}: {e}");
    }
}

#[test]
fn key_value_lines_quote_values_and_keep_other_pairs_as_args() {
    let (_, b) = ok(concat!(
        r#"2026-12-02T10:00:00Z stage="data prep" event=begin path="C:\data" note="say \"hi\" \\o/" rank=3 lr=0.5 seq=007 pid=11 tid=12"#,
        "\n",
        "2026-12-02T10:00:00Z level=info msg=\"a line that is not a marker\"\n",
        "2026-12-02T10:00:00Z starting up, 3 of 5 done\n",
        "time=2026-12-02T10:00:01Z level=info stage=\"data prep\" event=finish rank=3 pid=11 tid=12 rows=10\n",
        "ts=\"2026-12-02 10:00:02Z\" stage=x start\n",
        "timestamp=1796205603 stage=x stop\n",
    ));
    assert_eq!(
        stages(&b),
        vec![s("data prep", T0, SEC), s("x", T0 + 2 * SEC, SEC)]
    );
    assert_eq!(ints(&b, "pid"), vec![Some(11), None]);
    assert_eq!(ints(&b, "tid"), vec![Some(12), None]);
    assert_eq!(
        strings(&b, "args")[0].as_deref(),
        Some(
            r#"{"level":"info","lr":"0.5","note":"say \"hi\" \\o/","path":"C:\\data","rank":3,"rows":10,"seq":"007"}"#
        )
    );
}

#[test]
fn key_value_marker_errors_are_reported() {
    for (line, needle) in [
        ("2026-12-02T10:00:00Z stage=load", "without begin or end"),
        ("2026-12-02T10:00:00Z stage=load begin end", "two begin/end"),
        (
            "2026-12-02T10:00:00Z stage=load begin event=end",
            "two begin/end",
        ),
        (
            "2026-12-02T10:00:00Z stage=load begn",
            "unexpected word \"begn\"",
        ),
        ("2026-12-02T10:00:00Z stage=load event=go", "is not begin"),
        ("2026-12-02T10:00:00Z stage=load begin stage=x", "twice"),
        ("2026-12-02T10:00:00Z stage=load begin a=1 a=2", "twice"),
        ("2026-12-02T10:00:00Z stage= begin", "empty stage"),
        (
            "2026-12-02T10:00:00Z stage=load begin pid=x",
            "not an integer",
        ),
        ("2026-12-02T10:00:00Z stage=\"load begin", "malformed token"),
        ("2026-13-02T10:00:00Z stage=load begin", "month 13"),
        ("2026-12-02T10:00:00.Z stage=load begin", "not an ISO-8601"),
        ("17962056x stage=load begin", "not a timestamp"),
        ("time=yesterday stage=load begin", "not a timestamp"),
    ] {
        let e = err(&format!("2026-12-02T09:00:00Z hello\n\n{line}\n"));
        assert_eq!(e.at, Position::Line(3), "{line}");
        assert!(e.message.contains(needle), "{line}: {e}");
    }
}

#[test]
fn nested_stages_become_host_annotation_intervals() {
    let (t, b) = ok("1796205600 stage=train begin pid=5 tid=6\n\
         1796205601 stage=step begin step=0 pid=5 tid=6\n\
         1796205602 stage=step end pid=5 tid=6\n\
         1796205602 stage=step begin step=1 pid=5 tid=6\n\
         1796205604 stage=step end pid=5 tid=6\n\
         1796205605 stage=train end pid=5 tid=6\n");
    assert_eq!(
        stages(&b),
        vec![
            s("train", T0, 5 * SEC),
            s("step", T0 + SEC, SEC),
            s("step", T0 + 2 * SEC, 2 * SEC),
        ]
    );
    assert_eq!(
        strings(&b, "args"),
        vec![
            None,
            Some(r#"{"step":0}"#.to_string()),
            Some(r#"{"step":1}"#.to_string())
        ]
    );
    let h = &t.host;
    assert_eq!(h.host_span, Some((T0, T0 + 5 * SEC)));
    assert_eq!(h.threads.keys(), &[(5, 6)]);
    let ivs: Vec<(String, i64, i64, bool)> = h
        .intervals
        .iter()
        .map(|iv| {
            (
                h.names.name(iv.name).to_string(),
                iv.start,
                iv.end,
                iv.annotation(),
            )
        })
        .collect();
    assert_eq!(
        ivs,
        vec![
            ("train".to_string(), T0, T0 + 5 * SEC, true),
            ("step".to_string(), T0 + SEC, T0 + 2 * SEC, true),
            ("step".to_string(), T0 + 2 * SEC, T0 + 4 * SEC, true),
        ]
    );
}

#[test]
fn a_stage_re_begun_before_its_end_is_a_nested_instance() {
    let (_, b) = ok("1796205600 stage=a begin\n\
         1796205601 stage=a begin\n\
         1796205603 stage=a end\n\
         1796205610 stage=a end\n");
    assert_eq!(
        stages(&b),
        vec![s("a", T0, 10 * SEC), s("a", T0 + SEC, 2 * SEC)]
    );
}

#[test]
fn stages_pair_per_process_thread_and_rank() {
    let (_, b) = ok("1796205600 stage=load begin rank=0\n\
         1796205601 stage=load begin rank=1\n\
         1796205602 stage=load end rank=0\n\
         1796205604 stage=load end rank=1\n\
         1796205605 stage=x begin pid=1\n\
         1796205606 stage=x begin pid=2\n\
         1796205607 stage=x end pid=1\n\
         1796205609 stage=x end pid=2\n");
    assert_eq!(
        stages(&b),
        vec![
            s("load", T0, 2 * SEC),
            s("load", T0 + SEC, 3 * SEC),
            s("x", T0 + 5 * SEC, 2 * SEC),
            s("x", T0 + 6 * SEC, 3 * SEC),
        ]
    );
    assert_eq!(ints(&b, "pid"), vec![None, None, Some(1), Some(2)]);
    // An end for a rank with no open begin does not close another rank's stage.
    let e = err("1796205600 stage=load begin rank=0\n1796205601 stage=load end rank=1\n");
    assert_eq!(e.at, Position::Line(2));
}

#[test]
fn an_unterminated_stage_ends_at_the_last_log_timestamp() {
    let (t, b) = ok("1796205600 stage=train begin\n\
         1796205601 stage=step begin\n\
         1796205602 stage=step end\n\
         1796205609.5 msg=crashed\n\
         1796205605 level=info msg=\"clock went back\"\n");
    assert_eq!(
        stages(&b),
        vec![s("train", T0, 9 * SEC + SEC / 2), s("step", T0 + SEC, SEC)]
    );
    assert_eq!(t.warnings.get(UNTERMINATED), Some(&1));
    assert_eq!(t.warnings.len(), 1);
    assert_eq!(t.host.host_span, Some((T0, T0 + 9 * SEC + SEC / 2)));
}

#[test]
fn an_end_without_a_begin_is_an_error_at_its_line() {
    let log = "1796205600 stage=a begin\n\
               1796205601 stage=a end\n\
               \n\
               1796205602 stage=b end\n\
               1796205603 stage=c begin\n\
               1796205604 stage=c end\n";
    let e = err(log);
    assert_eq!(e.at, Position::Line(4));
    assert_eq!(e.message, "stage \"b\" ends without a begin");
    assert_eq!(e.to_string(), "line 4: stage \"b\" ends without a begin");
    let (t, b) = run(log, true).unwrap();
    assert_eq!(stages(&b), vec![s("a", T0, SEC), s("c", T0 + 3 * SEC, SEC)]);
    assert_eq!(t.warnings.get(END_WITHOUT_BEGIN), Some(&1));
}

#[test]
fn an_end_before_its_begin_is_an_error() {
    let log = "1796205605 stage=a begin\n\
               1796205604 stage=b begin\n\
               1796205606 stage=b end\n\
               1796205601 stage=a end\n";
    let e = err(log);
    assert_eq!(e.at, Position::Line(4));
    assert!(e.message.contains("ends before its begin on line 1"), "{e}");
    let (t, b) = run(log, true).unwrap();
    assert_eq!(stages(&b), vec![s("b", T0 + 4 * SEC, 2 * SEC)]);
    assert_eq!(t.warnings.get(END_BEFORE_BEGIN), Some(&1));
    assert_eq!(t.warnings.get(UNTERMINATED), None);
}

#[test]
fn a_garbled_line_is_an_error_and_nothing_reaches_the_sink() {
    let log = "2026-12-02T10:00:00Z stage=a begin\n\
               2026-12-02T10:00:01Z stage=a end\n\
               this is not a log line\n\
               2026-12-02T10:00:02Z stage=b begin\n";
    let mut calls = 0;
    let e = parse(log.as_bytes(), false, &mut |_| {
        calls += 1;
        Ok(())
    })
    .unwrap_err();
    assert_eq!(calls, 0);
    assert_eq!(e.at, Position::Line(3));
    assert!(e.message.starts_with("not a stage-log line"), "{e}");
    assert!(e.message.contains("\"this is not a log line\""), "{e}");
    let e = err("{\"ts\": 1, \"stage\": \"a\", \"event\": \"begin\"}\n\u{1}\u{2}\n");
    assert_eq!(e.at, Position::Line(2));
    let bytes = b"1796205600 stage=a begin\n\xff\xfe stage\n";
    let e = parse(&bytes[..], false, &mut |_| Ok(())).unwrap_err();
    assert_eq!(e.at, Position::Line(2));
    assert!(e.message.contains("UTF-8"), "{e}");
}

#[test]
fn lenient_mode_skips_and_counts_unparsable_lines() {
    let log = "garbage one\r\n\
               2026-12-02T10:00:00Z stage=a begin\r\n\
               {\"broken\": \r\n\
               2026-12-02T10:00:01Z stage=a end\r\n\
               2026-12-02T10:00:01Z stage=b\r\n\
               \r\n";
    assert_eq!(err(log).at, Position::Line(1));
    let (t, b) = run(log, true).unwrap();
    assert_eq!(stages(&b), vec![s("a", T0, SEC)]);
    assert_eq!(t.warnings.get(UNPARSABLE), Some(&3));
    assert_eq!(t.warnings.len(), 1);
}

#[test]
fn well_formed_lines_that_are_not_markers_are_ignored() {
    let (t, b) = ok("\u{feff}{\"level\": \"info\", \"msg\": \"hi\"}\n\
         \t \n\
         2026-12-02T10:00:00Z server listening on :8080\n\
         1796205600 begin\n\
         2026-12-02 10:00:00,001 INFO root: begin stage load\n\
         2026-12-02 10:00:00,001 - root - INFO - \n\
         {\"ts\": \"not a time\", \"msg\": \"ignored too\"}\n");
    assert_eq!(t.events, 0);
    assert_eq!(b.num_rows(), 0);
    assert!(t.warnings.is_empty());
    assert!(t.host.intervals.is_empty());
}

#[test]
fn looks_like_stage_log_accepts_each_grammar() {
    assert!(looks_like_stage_log(
        "{\"ts\": \"2026-12-02T10:00:00Z\", \"stage\": \"load\", \"event\": \"begin\"}\n"
    ));
    assert!(looks_like_stage_log(
        "2026-12-02T10:00:00.123456Z stage=load begin\n2026-12-02T10:00:01Z stage=lo"
    ));
    assert!(looks_like_stage_log(
        "2026-12-02 10:00:00,123 INFO torch: loading\n\
         2026-12-02 10:00:00,124 INFO train: [stage] load begin\n"
    ));
    assert!(looks_like_stage_log(
        "\n1796205600.5 stage=load begin\ngarbage later is parse's business\n"
    ));
}

#[test]
fn looks_like_stage_log_rejects_other_text() {
    for head in [
        "{\"traceEvents\": [\n{\"ph\": \"X\", \"name\": \"k\", \"ts\": 1, \"dur\": 2}",
        "{\n  \"schemaVersion\": 1,\n  \"traceEvents\": [",
        "{\"traceEvents\": [], \"stage\": \"load\"}",
        "ts,stage,event\n2026-12-02T10:00:00Z,load,begin\n",
        "1796205600,load,begin\n1796205601,load,end\n",
        "Kernel Name,Duration\nsm90_gemm,12\n",
        "It was a dark and stormy night; the stage was set.\nstage=load begin\n",
        "2026-12-02T10:00:00Z server listening\n",
        "",
        "\n\n",
        "SQLite format 3\u{0}",
    ] {
        assert!(!looks_like_stage_log(head), "{head:?}");
    }
}

/// The snippet of `docs/stage-logs.md` is `fixtures/stagelog/python_snippet.py` up to its
/// `__main__` block, and `python_snippet.log` is what running that file printed.
#[test]
fn the_documented_python_snippet_output_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(dir.join("fixtures/stagelog/python_snippet.py")).unwrap();
    let snippet = script.split("if __name__").next().unwrap().trim();
    let doc = std::fs::read_to_string(dir.join("../docs/stage-logs.md")).unwrap();
    assert!(
        doc.contains(snippet),
        "docs/stage-logs.md lacks the snippet"
    );
    let log = std::fs::read_to_string(dir.join("fixtures/stagelog/python_snippet.log")).unwrap();
    assert!(looks_like_stage_log(&log));
    let (t, b) = ok(&log);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    // Epoch ns of the fixture's lines, computed with Python's datetime.
    let at = [
        1_796_229_658_460_877_000,
        1_796_229_658_471_112_000,
        1_796_229_658_471_208_000,
        1_796_229_658_471_230_000,
        1_796_229_658_476_363_000,
        1_796_229_658_476_453_000,
        1_796_229_658_481_603_000,
        1_796_229_658_481_672_000,
    ];
    assert_eq!(
        stages(&b),
        vec![
            s("load", at[0], at[1] - at[0]),
            s("train", at[2], at[7] - at[2]),
            s("step", at[3], at[4] - at[3]),
            s("step", at[5], at[6] - at[5]),
        ]
    );
    assert_eq!(
        strings(&b, "args"),
        vec![
            None,
            Some(r#"{"rank":0}"#.to_string()),
            Some(r#"{"step":0}"#.to_string()),
            Some(r#"{"step":1}"#.to_string()),
        ]
    );
}

#[test]
fn no_input_makes_it_panic() {
    let samples = [
        "2026-12-02T10:00:00.123456789+01:00 stage=\"dåta prép\" begin note=\"é\\\"x\" pid=1",
        "{\"ts\": 1796205600.5, \"stage\": \"ü\", \"event\": \"begin\", \"a\": [1, {\"b\": \"é\"}]}",
        "2026-12-02 10:00:00,123+0100 - naïve - INFO - [stage] \"löad\" begin rank=1",
        "ts=\"2026-12-02 10:00:00Z\" stage=é event=end",
        "1796205600123456789 stage=ß end",
        "2026-12-02 10:00:00,123 INFO x: stage=\"\\",
    ];
    for lenient in [false, true] {
        for sample in samples {
            // Every prefix, cut at each character boundary.
            for (i, _) in sample.char_indices().chain([(sample.len(), ' ')]) {
                let cut = &sample[..i];
                let _ = looks_like_stage_log(cut);
                let _ = run(&format!("{cut}\n{cut}"), lenient);
            }
        }
        for odd in [
            "9999-12-31T23:59:59.999999999-23:59 stage=a begin",
            "0000-01-01T00:00:00Z stage=a begin",
            "99999999999999999999999999 stage=a begin",
            "1796205600 stage=a begin\n9223372036854775807 stage=a end",
            "1677-09-21T00:12:43.145224192Z stage=a begin\n2262-04-11T23:47:16.854775807Z stage=a end",
            "1677-09-21T00:12:43.145224192Z stage=a begin\n2262-04-11T23:47:16Z x",
            "{\"ts\": 1e999, \"stage\": \"a\", \"event\": \"begin\"}",
            "[1, 2]",
            "{}",
            "\"\"",
        ] {
            let _ = run(odd, lenient);
        }
    }
}

/// Parses `text` (leniently) as a log still being written, of which the bytes before `from`
/// were read before, for a run on `clock` if one is given.
fn growing(
    text: &str,
    from: usize,
    clock: Option<&clock::RunClock>,
) -> (ParsedTrace, Vec<(String, i64, i64)>) {
    let mut batches = Vec::new();
    let t = parse_onto(
        text.as_bytes(),
        true,
        None,
        clock,
        Some(from as u64),
        &mut |b| {
            batches.push(b);
            Ok(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let schema = gpuq_engine::schema::TableKind::Events.file_schema();
    (t, stages(&concat_batches(&schema, &batches).unwrap()))
}

#[test]
fn a_growing_log_gives_each_stage_once_when_it_ends_and_lists_those_still_open() {
    let lines = [
        "2026-12-02T10:00:00Z stage=train begin rank=0\n",
        "2026-12-02T10:00:01Z stage=step begin\n",
        "not a log line\n",
        "2026-12-02T10:00:02Z stage=step end\n",
        "2026-12-02T10:00:03Z stage=eval end\n",
        "2026-12-02T10:00:04Z stage=step begin\n",
        "2026-12-02T10:00:06Z stage=step end\n",
        "2026-12-02T10:00:07Z stage=train end rank=0\n",
    ];
    let text = lines.concat();
    let ends: Vec<usize> = lines
        .iter()
        .scan(0, |at, l| {
            *at += l.len();
            Some(*at)
        })
        .collect();
    // Read after each line: every stage comes exactly once, at the read that saw its end.
    let mut all = Vec::new();
    let mut warnings: BTreeMap<String, u64> = BTreeMap::new();
    let mut from = 0;
    let mut open_after = Vec::new();
    for &upto in &ends {
        let (t, got) = growing(&text[..upto], from, None);
        all.extend(got);
        for (k, v) in t.warnings {
            *warnings.entry(k).or_default() += v;
        }
        let open = t.open_stages.expect("a growing read lists open stages");
        open_after.push(open.iter().map(|o| o.name.clone()).collect::<Vec<_>>());
        from = upto;
    }
    all.sort();
    let (_, whole) = run(&text, true).unwrap();
    let mut whole = stages(&whole);
    whole.sort();
    assert_eq!(all, whole);
    assert_eq!(all.len(), 3);
    // The open stages after each line, oldest begin first.
    assert_eq!(
        open_after,
        vec![
            vec!["train"],
            vec!["train", "step"],
            vec!["train", "step"],
            vec!["train"],
            vec!["train"],
            vec!["train", "step"],
            vec!["train"],
            vec![],
        ]
    );
    // The warnings of the unparsable line and of the end without a begin count once each,
    // though every read pairs the whole log again.
    assert_eq!(warnings.get(UNPARSABLE), Some(&1));
    assert_eq!(warnings.get(END_WITHOUT_BEGIN), Some(&1));
    // A still-open stage keeps its begin's time and fields, and is not closed.
    let (t, got) = growing(&text[..ends[1]], ends[0], None);
    assert!(got.is_empty());
    let open = t.open_stages.unwrap();
    assert_eq!(open[0].ts, T0);
    assert_eq!(open[0].args.as_deref(), Some(r#"{"rank":0}"#));
    assert!(!t.warnings.contains_key(UNTERMINATED));
}

#[test]
fn a_growing_log_is_placed_on_the_run_clock_by_all_its_stages_so_far() {
    // A session-clock run (Nsight Systems) that started at T0 and spans its first 2 s.
    let clock = clock::RunClock {
        first_ts: 0,
        last_ts: 2 * SEC,
        epoch: false,
        session_start_utc_ns: Some(T0),
    };
    let text = "2026-12-02T10:00:01Z stage=train begin\n\
                2026-12-02T10:00:05Z stage=eval begin\n\
                2026-12-02T10:00:06Z stage=eval end\n";
    let first_line = text.find('\n').unwrap() + 1;
    // The new lines alone (eval, 5-6 s) lie outside the run; the log so far (from 1 s) does
    // not, and a read of the whole log would take it.
    let (t, got) = growing(text, first_line, Some(&clock));
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(got, vec![s("eval", 5 * SEC, SEC)]);
    assert!(!t.epoch_time);
    // The open stage is on the run's clock too.
    assert_eq!(t.open_stages.unwrap()[0].ts, SEC);
}
