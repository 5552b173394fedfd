//! The JSON cursor's readers (numbers, times, strings, arrays) and the scanners that find an
//! event's extent, at every alignment to the 64-byte chunks.

use super::*;

#[test]
fn object_extent_finds_the_only_nested_object_in_the_same_pass() {
    let pad = |n: usize| " ".repeat(n);
    // Strings with brackets and escapes, at every alignment to the 64-byte chunks.
    for shift in 0..70 {
        let args = r#"{"a": "}{", "b": [1, {"c": 2}], "d": {"e": "\"}"}, "f": [[1]]}"#;
        let event = format!(
            r#"{}{{"name": "x{}", "ts": 1, "args": {args}, "tail": "]}}"}}"#,
            pad(shift),
            "y".repeat(shift)
        );
        let start = shift;
        let (end, object) = object_extent(event.as_bytes(), start).expect("complete");
        assert_eq!(end, event.len(), "shift {shift}");
        assert_eq!(Some(end), find_value_end(event.as_bytes(), start));
        let (a, b) = object.expect("one nested object");
        assert_eq!(&event[a..b], args, "shift {shift}");
        // With a backslash in the same chunk the scan goes byte by byte.
        let escaped = event.replacen("x", "\\n", 1);
        let (_, object) = object_extent(escaped.as_bytes(), start).expect("complete");
        let (a, b) = object.expect("one nested object");
        assert_eq!(&escaped[a..b], args, "shift {shift}, escaped");
    }
    // None, or more than one, nested object: no span.
    for text in [
        r#"{"name": "x", "ts": 1}"#,
        r#"{"args": {}, "more": {"a": 1}}"#,
        r#"{"args": {"a": 1}, "list": [{"b": 2}]}"#,
    ] {
        let (end, object) = object_extent(text.as_bytes(), 0).expect("complete");
        assert_eq!(end, text.len());
        assert_eq!(object, None, "{text}");
    }
    // An array member holding the only nested object: its span, which is not an `args`
    // value (the parser only takes a span that starts where its value does).
    let text = r#"{"list": [{"b": 2}], "args": 5}"#;
    let (_, object) = object_extent(text.as_bytes(), 0).expect("complete");
    assert_eq!(object.map(|(a, b)| &text[a..b]), Some(r#"{"b": 2}"#));
    assert_eq!(object_extent(b"{\"a\": {", 0), None);
    assert_eq!(object_extent(b"[1]", 0), None);
}

/// A fixed pseudo-random sequence (xorshift64) for generated inputs.
fn xorshift() -> impl FnMut() -> u64 {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// The AVX2 scan (taken on CPUs that have it) and the baseline one agree on every chunk,
/// and on where values of random brackets, quotes and escapes end.
#[test]
#[cfg(target_arch = "x86_64")]
fn the_avx2_and_baseline_scans_agree() {
    if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("pclmulqdq")) {
        eprintln!("skipped: this CPU has no AVX2 or no carry-less multiplication");
        return;
    }
    let mut next = xorshift();
    const ALPHABET: &[u8] = b"{}[]\"\\ a:,{}\"";
    let mut hits = 0;
    for round in 0..20_000 {
        let len = 1 + (next() % 300) as usize;
        let mut text: Vec<u8> = (0..len)
            .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
            .collect();
        text[0] = if round % 2 == 0 { b'{' } else { b'[' };
        let chunk: &[u8; 64] = &[&text[..], &[b' '; 64][..]].concat()[..64]
            .try_into()
            .unwrap();
        let x = next();
        // SAFETY: the features were detected above.
        unsafe {
            let (a, b) = (
                Baseline::masks(chunk, b'{', b'}'),
                Avx2::masks(chunk, b'{', b'}'),
            );
            assert_eq!(
                (a.quote, a.backslash, a.open, a.close),
                (b.quote, b.backslash, b.open, b.close)
            );
            assert_eq!(Baseline::prefix_xor(x), Avx2::prefix_xor(x), "{x:#x}");
        }
        let baseline = scan_value_with::<Baseline>(&text, 0);
        // SAFETY: as above.
        let avx2 = unsafe { scan_value_avx2(&text, 0) };
        let summary =
            |r: Option<(usize, BracketScan)>| r.map(|(end, s)| (end, s.nested, s.nested_span));
        hits += baseline.is_some() as usize;
        assert_eq!(
            summary(baseline),
            summary(avx2),
            "{}",
            String::from_utf8_lossy(&text)
        );
    }
    // Random text rarely closes its first bracket, but some of it must.
    assert!(hits > 100, "only {hits} values ended");
}

/// The one-pass number readers give what the general path (the value's text, then
/// [`us_to_ns`] / [`scalar_i64`]) gives, or leave the cursor where it was.
#[test]
fn one_pass_numbers_equal_the_general_path() {
    let mut texts: Vec<String> = [
        "0",
        "7",
        "007",
        "12",
        "12.5",
        "12.50",
        "1.",
        "1.123",
        "1.1234",
        "1.12345",
        "-1",
        "-0",
        "-12.5",
        "+3",
        "1e3",
        "1.5E2",
        "2e-3",
        "1.2.3",
        "1-2",
        "-",
        "-.5",
        ".5",
        "9223372036854775807",
        "9223372036854775808",
        "999999999999999999",
        "1000000000000000000",
        "1700759084287218.300",
        "17007590842872183.001",
        "170075908428721830.0",
        "18446744073709551615",
        "12x",
        "\"5\"",
        "true",
        "null",
        "[1]",
        "{}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut next = xorshift();
    for _ in 0..2000 {
        let digits = 1 + next() % 21;
        let mut t: String = (0..digits)
            .map(|_| char::from(b'0' + (next() % 10) as u8))
            .collect();
        if next() % 2 == 0 {
            let at = (next() % digits) as usize;
            t.insert(at.max(1), '.');
        }
        if next() % 4 == 0 {
            t.insert(0, '-');
        }
        texts.push(t);
    }
    for text in &texts {
        for end in [", \"k\": 1}", "}", " ]", ""] {
            let doc = format!(" {text}{end}");
            // Each one-pass reader, and what the general path makes of the value's text.
            let readers: [(fn(&mut Cursor<'_>) -> Option<i64>, fn(&str) -> Option<i64>); 2] = [
                (|c| c.plain_us_ns(), us_to_ns),
                (|c| c.plain_int(), |n| scalar_i64(&Scalar::Number(n))),
            ];
            for (one_pass, of_text) in readers {
                let mut general = Cursor::new(doc.as_bytes());
                let expected = match general.value() {
                    Ok(Scalar::Number(n)) => of_text(n).map(|x| (x, general.pos)),
                    _ => None,
                };
                let mut c = Cursor::new(doc.as_bytes());
                match one_pass(&mut c) {
                    Some(x) => assert_eq!(Some((x, c.pos)), expected, "{doc:?}"),
                    None => assert_eq!(c.pos, 1, "{doc:?}: the cursor moved"),
                }
            }
            let mut a = Cursor::new(doc.as_bytes());
            let mut b = Cursor::new(doc.as_bytes());
            match (a.int_value(), b.value()) {
                (Ok(x), Ok(v)) => {
                    assert_eq!(x, scalar_i64(&v), "{doc:?}");
                    assert_eq!(a.pos, b.pos, "{doc:?}");
                }
                (x, v) => assert_eq!(x.is_err(), v.is_err(), "{doc:?}"),
            }
        }
    }
    // The common shapes do take the one-pass path.
    let mut c = Cursor::new(b"1700759084287218.300,");
    assert_eq!(c.plain_us_ns(), Some(1_700_759_084_287_218_300));
    let mut c = Cursor::new(b"-42}");
    assert_eq!(c.plain_int(), Some(-42));
}

#[test]
fn eight_digits_at_once_are_their_value_and_nothing_else_passes() {
    let mut next = xorshift();
    for _ in 0..10_000 {
        let digits: Vec<u8> = (0..8).map(|_| b'0' + (next() % 10) as u8).collect();
        let value = std::str::from_utf8(&digits)
            .unwrap()
            .parse::<u64>()
            .unwrap();
        assert_eq!(eight_digits(&digits), Some(value));
        // Any one byte that is not a digit, including those next to '0' and '9' and those
        // whose +6 carries into the next byte.
        let mut bad = digits.clone();
        let at = (next() % 8) as usize;
        bad[at] = [
            b'/',
            b':',
            b'.',
            b'-',
            b' ',
            0x00,
            0x3F,
            0xFA,
            0xFF,
            next() as u8,
        ][(next() % 10) as usize];
        if !bad[at].is_ascii_digit() {
            assert_eq!(eight_digits(&bad), None, "{bad:?}");
        }
    }
    assert_eq!(eight_digits(b"00000000"), Some(0));
    assert_eq!(eight_digits(b"99999999"), Some(99_999_999));
    assert_eq!(eight_digits(b"1234567"), None);
}

#[test]
fn converts_decimal_microseconds_exactly() {
    assert_eq!(
        us_to_ns("1695835572943613"),
        Some(1_695_835_572_943_613_000)
    );
    assert_eq!(
        us_to_ns("1695835572943613.123"),
        Some(1_695_835_572_943_613_123)
    );
    assert_eq!(us_to_ns("0.001"), Some(1));
    assert_eq!(us_to_ns("12.3456"), Some(12_346));
    assert_eq!(us_to_ns("12.3454"), Some(12_345));
    assert_eq!(us_to_ns("-0.5"), Some(-500));
    assert_eq!(us_to_ns("1.5e3"), Some(1_500_000));
    assert_eq!(us_to_ns("2E-3"), Some(2));
    assert_eq!(us_to_ns("7"), Some(7000));
    assert_eq!(us_to_ns(""), None);
    assert_eq!(us_to_ns("1.2.3"), None);
    assert_eq!(us_to_ns("abc"), None);
    assert_eq!(us_to_ns("1e400"), None);
    // The fast path's edges: 19 digits, 3 decimals, a bare dot, and where it hands over.
    assert_eq!(
        us_to_ns("1700759084287218.300"),
        Some(1_700_759_084_287_218_300)
    );
    assert_eq!(us_to_ns("9999999999999999999"), None);
    assert_eq!(us_to_ns("99999999999999999999"), None);
    assert_eq!(us_to_ns("00000000000000000001.5"), Some(1_500));
    assert_eq!(
        us_to_ns("999999999999999.999"),
        Some(999_999_999_999_999_999)
    );
    assert_eq!(us_to_ns("9223372036854775.807"), Some(i64::MAX));
    assert_eq!(us_to_ns("9223372036854775.808"), None);
    assert_eq!(us_to_ns("9999999999999999.99"), None);
    assert_eq!(
        us_to_ns("1695835572943613.1234"),
        Some(1_695_835_572_943_613_123)
    );
    assert_eq!(
        us_to_ns("1695835572943613.1235"),
        Some(1_695_835_572_943_613_124)
    );
    assert_eq!(us_to_ns("99999999999999999.99"), None);
    assert_eq!(us_to_ns("12."), Some(12_000));
    assert_eq!(us_to_ns(".5"), Some(500));
    assert_eq!(us_to_ns("."), None);
    assert_eq!(us_to_ns("0.000"), Some(0));
    // a float would round this
    let f = 1695835572943613.123f64 * 1000.0;
    assert_ne!(f as i64, 1_695_835_572_943_613_123);
}

#[test]
fn walks_objects_and_skips_compounds() {
    let text = br#"{"a": "x\"y", "b": [1, {"c": "}"}], "n": -1.5e2, "t": true, "z": null, "u": "\u00e9\ud83d\ude00"}"#;
    let mut c = Cursor::new(text);
    let mut seen = Vec::new();
    c.object(|k, c| {
        let v = c.value()?;
        seen.push((k.to_string(), format!("{v:?}")));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen.len(), 6);
    assert_eq!(seen[0].1, r#"Str("x\"y")"#);
    assert!(seen[1].1.starts_with("Compound"));
    assert_eq!(seen[2].1, r#"Number("-1.5e2")"#);
    assert_eq!(seen[5].1, "Str(\"é😀\")");
    assert_eq!(c.pos, text.len());
}

#[test]
fn reports_offsets_of_errors() {
    let mut c = Cursor::new(br#"{"a": 1, "b" 2}"#);
    let err = c.object(|_, c| c.value().map(|_| ())).unwrap_err();
    assert_eq!(err.offset, 13);
    let mut c = Cursor::new(br#"{"a": "unterminated"#);
    assert!(c.object(|_, c| c.value().map(|_| ())).is_err());
    assert_eq!(find_value_end(br#"{"a": "}"#, 0), None);
    assert_eq!(find_value_end(br#"{"a": "\"}"} "#, 0), Some(12));
    assert_eq!(
        find_value_end(br#"{"a": [1, {"b": "]}"}], "c": {}} tail"#, 0),
        Some(32)
    );
    assert_eq!(find_value_end(br#"[{"a": "["}, [2]] x"#, 0), Some(17));
    assert_eq!(find_value_end(br#"{"a": "\"#, 0), None);
    assert_eq!(find_value_end(b"7", 0), None);
}

/// An independent scan (memchr from bracket to quote to bracket, the previous
/// implementation), as the reference for the chunked one.
fn value_end_reference(buf: &[u8], start: usize) -> Option<usize> {
    let (open, close) = match buf.get(start)? {
        b'{' => (b'{', b'}'),
        b'[' => (b'[', b']'),
        _ => return None,
    };
    let mut depth = 0usize;
    let mut i = start;
    loop {
        i += memchr::memchr3(b'"', open, close, &buf[i..])?;
        match buf[i] {
            b'"' => {
                i += 1;
                loop {
                    i += memchr::memchr2(b'"', b'\\', &buf[i..])?;
                    if buf[i] == b'\\' {
                        i += 2;
                        if i > buf.len() {
                            return None;
                        }
                    } else {
                        break;
                    }
                }
            }
            b if b == open => depth += 1,
            _ => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
        }
        i += 1;
    }
}

#[test]
fn quote_or_backslash_finds_the_first_of_either() {
    for text in [
        &b"abc\"def"[..],
        b"0123456789abcdef\"",
        b"0123456789abcde\\x\"",
        b"0123456789abcdef0123\\",
        b"0123456789abcdef0123456789",
        b"",
        b"\"",
    ] {
        let want = text.iter().position(|&b| b == b'"' || b == b'\\');
        assert_eq!(
            quote_or_backslash(text),
            want,
            "{:?}",
            String::from_utf8_lossy(text)
        );
    }
}

#[test]
fn chunked_value_end_equals_the_byte_scan() {
    // Random JSON-like texts: nested objects and arrays, strings holding brackets, quotes
    // and backslash escapes, long plain runs; every bracket position as a start, and
    // every text cut short too.
    let mut next = xorshift();
    let pieces: [&[u8]; 14] = [
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\",
        b"\\\"",
        b",",
        b":",
        b"a",
        b"0123456789",
        b"\"name\": \"aten::mm\", ",
        b"{\"k\": \"}{][\"}",
        b"\n   ",
    ];
    let mut checked = 0;
    for _ in 0..3000 {
        let len = (next() % 400) as usize;
        let mut text = Vec::new();
        // Mostly escape-free texts, so that the mask path runs, some with escapes.
        let escapes = next() % 3 == 0;
        while text.len() < len {
            let p = pieces[(next() % pieces.len() as u64) as usize];
            if !escapes && p.contains(&b'\\') {
                continue;
            }
            text.extend_from_slice(p);
        }
        for start in 0..text.len() {
            if matches!(text[start], b'{' | b'[') {
                for end in [
                    text.len(),
                    start + (next() as usize % (text.len() - start + 1)),
                ] {
                    let t = &text[..end];
                    assert_eq!(
                        find_value_end(t, start),
                        value_end_reference(t, start),
                        "{:?} from {start}",
                        String::from_utf8_lossy(t)
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

#[test]
fn parses_integers_in_text() {
    assert_eq!(parse_int_text("stream 7"), Some(7));
    assert_eq!(parse_int_text("0x1f"), Some(31));
    assert_eq!(parse_int_text("25738"), Some(25738));
    assert_eq!(parse_int_text("Spans"), None);
    assert_eq!(parse_int_text("PyTorch Profiler"), None);
    let mut c = Cursor::new(b"[132, 1, 1]");
    assert_eq!(c.int_triple().unwrap(), Some([Some(132), Some(1), Some(1)]));
}

/// The one-pass triple takes exactly the plain `[x, y, z]` forms, with the values and end
/// that the general reader finds; anything else leaves the cursor where it was.
#[test]
fn plain_int_triples_are_read_in_one_pass_and_others_left_alone() {
    for (text, want) in [
        (&b"[132, 1, 1],"[..], Some([132, 1, 1])),
        (b" [ 6144 ,1,\n 1 ] }", Some([6144, 1, 1])),
        (b"[-1, 0, 2147483648]", Some([-1, 0, 2147483648])),
        (b"[1, 2]", None),
        (b"[1, 2, 3, 4]", None),
        (b"[1, 2, 3,]", None),
        (b"[1.0, 2, 3]", None),
        (b"[1e3, 2, 3]", None),
        (b"[\"1\", 2, 3]", None),
        (b"[1, 2, null]", None),
        (b"[1234567890123456789, 1, 1]", None),
        (b"[-, 1, 1]", None),
        (b"[1, 2, 3", None),
        (b"{\"x\": 1}", None),
        (b"7", None),
    ] {
        let shown = String::from_utf8_lossy(text);
        let mut c = Cursor::new(text);
        let got = c.plain_int_triple();
        assert_eq!(got, want, "{shown}");
        match got {
            Some(t) => {
                let mut general = Cursor::new(text);
                let g = general.int_triple().unwrap();
                assert_eq!(g, Some(t.map(Some)), "{shown}");
                assert_eq!(c.pos, general.pos, "{shown}");
            }
            None => assert_eq!(c.pos, 0, "{shown}"),
        }
    }
}
