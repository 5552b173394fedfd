//! A small zero-copy JSON cursor for trace events.
//!
//! Trace files are large arrays of small objects. This reader walks one object at a time
//! without building a tree, borrows strings from the input unless they contain escapes, and
//! returns numbers as their raw text so that decimal microseconds convert to nanoseconds
//! exactly (a float cannot hold an epoch timestamp in nanoseconds).

use std::borrow::Cow;

/// A syntax error at a byte offset of the buffer being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub offset: usize,
    pub message: String,
}

/// Boxed: a parse returns a `Result` per key and value, and a small one stays in registers.
pub type Result<T> = std::result::Result<T, Box<SyntaxError>>;

/// A scalar or a skipped compound value.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    /// Raw number text, e.g. `1695835572943613.123`.
    Number(&'a str),
    Str(Cow<'a, str>),
    /// An object or array; the raw text is `buf[start..end]`.
    Compound {
        start: usize,
        end: usize,
        object: bool,
    },
}

impl Scalar<'_> {
    pub fn type_name(&self) -> &'static str {
        match self {
            Scalar::Null => "null",
            Scalar::Bool(_) => "a boolean",
            Scalar::Number(_) => "a number",
            Scalar::Str(_) => "a string",
            Scalar::Compound { object: true, .. } => "an object",
            Scalar::Compound { object: false, .. } => "an array",
        }
    }
}

#[derive(Clone, Copy)]
pub struct Cursor<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
    /// `buf` as text, when it is known to be UTF-8: strings are then sliced out of it instead
    /// of being validated one by one (a slice between two ASCII quotes of valid UTF-8 is valid).
    text: Option<&'a str>,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor::at(buf, 0)
    }

    pub fn at(buf: &'a [u8], pos: usize) -> Cursor<'a> {
        Cursor {
            buf,
            pos,
            text: None,
        }
    }

    /// A cursor over text already validated as UTF-8 (once per block rather than per string).
    pub fn at_text(text: &'a str, pos: usize) -> Cursor<'a> {
        Cursor {
            buf: text.as_bytes(),
            pos,
            text: Some(text),
        }
    }

    /// A cursor over `buf[..end]` at `pos`, keeping what is known of the text.
    pub fn sub(&self, end: usize, pos: usize) -> Cursor<'a> {
        Cursor {
            buf: &self.buf[..end],
            pos,
            text: self.text.map(|t| &t[..end]),
        }
    }

    /// `buf[a..b]` as text; `None` if it is not UTF-8.
    pub fn text_of(&self, a: usize, b: usize) -> Option<&'a str> {
        match self.text {
            Some(t) => t.get(a..b),
            None => std::str::from_utf8(&self.buf[a..b]).ok(),
        }
    }

    #[cold]
    pub fn error<T>(&self, message: impl Into<String>) -> Result<T> {
        Err(Box::new(SyntaxError {
            offset: self.pos,
            message: message.into(),
        }))
    }

    /// `buf[a..b]` as text where `a` follows and `b` is at an ASCII byte (a quote, a bracket,
    /// the end of a number).
    /// Like [`Cursor::text_of`], without its checks of `a` and `b` on known text.
    #[inline]
    fn ascii_bounded(&self, a: usize, b: usize) -> Option<&'a str> {
        match self.text {
            Some(t) => {
                assert!(a <= b && b <= t.len());
                // SAFETY: `text` is valid UTF-8 and `a..b` lies within it; a position next to
                // an ASCII byte is a char boundary, since ASCII bytes never occur inside a
                // multi-byte character.
                Some(unsafe { t.get_unchecked(a..b) })
            }
            None => std::str::from_utf8(&self.buf[a..b]).ok(),
        }
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        while let Some(&b) = self.buf.get(self.pos) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.pos += 1;
        }
    }

    #[inline]
    pub fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.buf.get(self.pos).copied()
    }

    #[inline]
    pub fn expect(&mut self, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            return Ok(());
        }
        self.unexpected(byte)
    }

    #[cold]
    fn unexpected(&mut self, byte: u8) -> Result<()> {
        match self.peek() {
            Some(b) => self.error(format!(
                "expected '{}', found '{}'",
                byte as char,
                printable(b)
            )),
            None => self.error(format!(
                "unexpected end of input, expected '{}'",
                byte as char
            )),
        }
    }

    /// Parses a string starting at the current `"`.
    #[inline]
    pub fn string(&mut self) -> Result<Cow<'a, str>> {
        self.expect(b'"')?;
        let start = self.pos;
        match quote_or_backslash(&self.buf[start..]) {
            Some(rel) if self.buf[start + rel] == b'"' => {
                self.pos = start + rel + 1;
                Ok(match self.ascii_bounded(start, start + rel) {
                    Some(s) => Cow::Borrowed(s),
                    None => String::from_utf8_lossy(&self.buf[start..start + rel]),
                })
            }
            Some(rel) => self.escaped_string(start, rel),
            None => self.error("unterminated string"),
        }
    }

    /// The rest of [`Cursor::string`] from `start` (after the quote), for a string whose
    /// first backslash is at `start + rel`.
    #[cold]
    #[inline(never)]
    fn escaped_string(&mut self, start: usize, rel: usize) -> Result<Cow<'a, str>> {
        let rest = &self.buf[start..];
        let mut out: Vec<u8> = rest[..rel].to_vec();
        self.pos = start + rel;
        loop {
            let Some(&b) = self.buf.get(self.pos) else {
                return self.error("unterminated string");
            };
            self.pos += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.buf.get(self.pos) else {
                        return self.error("unterminated escape");
                    };
                    self.pos += 1;
                    match e {
                        b'"' => out.push(b'"'),
                        b'\\' => out.push(b'\\'),
                        b'/' => out.push(b'/'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let c = self.hex4()?;
                            let ch = if (0xD800..0xDC00).contains(&c) {
                                // surrogate pair
                                if self.buf.get(self.pos) == Some(&b'\\')
                                    && self.buf.get(self.pos + 1) == Some(&b'u')
                                {
                                    self.pos += 2;
                                    let lo = self.hex4()?;
                                    char::from_u32(
                                        0x10000
                                            + ((c - 0xD800) << 10)
                                            + (lo.wrapping_sub(0xDC00) & 0x3FF),
                                    )
                                } else {
                                    None
                                }
                            } else {
                                char::from_u32(c)
                            };
                            let mut tmp = [0u8; 4];
                            out.extend_from_slice(
                                ch.unwrap_or('\u{FFFD}').encode_utf8(&mut tmp).as_bytes(),
                            );
                        }
                        other => {
                            self.pos -= 1;
                            return self.error(format!("invalid escape '\\{}'", printable(other)));
                        }
                    }
                }
                other => out.push(other),
            }
        }
        Ok(Cow::Owned(String::from_utf8_lossy(&out).into_owned()))
    }

    fn hex4(&mut self) -> Result<u32> {
        let Some(digits) = self.buf.get(self.pos..self.pos + 4) else {
            return self.error("truncated \\u escape");
        };
        let s = std::str::from_utf8(digits)
            .ok()
            .and_then(|s| u32::from_str_radix(s, 16).ok());
        match s {
            Some(v) => {
                self.pos += 4;
                Ok(v)
            }
            None => self.error("invalid \\u escape"),
        }
    }

    fn number(&mut self) -> Result<&'a str> {
        let start = self.pos;
        while let Some(&b) = self.buf.get(self.pos) {
            if !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                break;
            }
            self.pos += 1;
        }
        if self.pos == start {
            return self.error("expected a number");
        }
        // Only ASCII digits and signs were consumed.
        Ok(self.ascii_bounded(start, self.pos).expect("ascii"))
    }

    fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.buf.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(())
        } else {
            self.error("invalid literal")
        }
    }

    /// The number at the cursor as integer nanoseconds, read in the same pass that finds its
    /// end, when it is decimal microseconds written plainly (`digits[.digits]`, as
    /// [`plain_us_to_ns`] takes them): what [`us_to_ns`] of its [`Cursor::value`] gives. `None`,
    /// the cursor at the number (past any whitespace), for anything else (a sign, an exponent,
    /// a string), which the caller reads with [`Cursor::value`].
    #[inline]
    pub fn plain_us_ns(&mut self) -> Option<i64> {
        self.skip_ws();
        let start = self.pos;
        if !self.buf.get(start).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        let mut number = PlainUs::default();
        // Epoch microseconds have 16 digits before the point: taken eight at a time.
        while number.digits + 8 <= 19 {
            let Some(eight) = self.buf.get(self.pos..self.pos + 8).and_then(eight_digits) else {
                break;
            };
            number.value = number.value * 100_000_000 + eight;
            number.digits += 8;
            self.pos += 8;
        }
        while let Some(&b) = self.buf.get(self.pos) {
            if !number.take(b) {
                if matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    self.pos = start;
                    return None;
                }
                break;
            }
            self.pos += 1;
        }
        let ns = number.ns();
        if ns.is_none() {
            self.pos = start;
        }
        ns
    }

    /// The number at the cursor as an integer, read in the same pass that finds its end, when
    /// it is written as plain decimal digits (at most 18, with an optional `-`): what
    /// [`scalar_i64`] of its [`Cursor::value`] gives. `None`, the cursor at the number (past any
    /// whitespace), for anything else.
    #[inline]
    pub fn plain_int(&mut self) -> Option<i64> {
        self.skip_ws();
        let start = self.pos;
        let negative = self.buf.get(self.pos) == Some(&b'-');
        if negative {
            self.pos += 1;
        }
        let mut value: i64 = 0;
        let mut digits = 0;
        while let Some(&b) = self.buf.get(self.pos) {
            match b {
                // 18 digits stay below 10^18 < 2^63.
                b'0'..=b'9' if digits < 18 => {
                    value = value * 10 + (b - b'0') as i64;
                    digits += 1;
                }
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E' => {
                    self.pos = start;
                    return None;
                }
                _ => break,
            }
            self.pos += 1;
        }
        if digits == 0 {
            self.pos = start;
            return None;
        }
        Some(if negative { -value } else { value })
    }

    /// An integer value: [`Cursor::plain_int`], else [`scalar_i64`] of [`Cursor::value`].
    #[inline]
    pub fn int_value(&mut self) -> Result<Option<i64>> {
        match self.plain_int() {
            Some(v) => Ok(Some(v)),
            None => Ok(scalar_i64(&self.value()?)),
        }
    }

    /// Reads any value; objects and arrays are skipped and returned by their span.
    pub fn value(&mut self) -> Result<Scalar<'a>> {
        match self.peek() {
            Some(b'"') => Ok(Scalar::Str(self.string()?)),
            Some(b'{') | Some(b'[') => {
                let start = self.pos;
                let object = self.buf[start] == b'{';
                match find_value_end(self.buf, start) {
                    Some(end) => {
                        self.pos = end;
                        Ok(Scalar::Compound { start, end, object })
                    }
                    None => self.error("unexpected end of input inside a value"),
                }
            }
            Some(b't') => self.literal(b"true").map(|_| Scalar::Bool(true)),
            Some(b'f') => self.literal(b"false").map(|_| Scalar::Bool(false)),
            Some(b'n') => self.literal(b"null").map(|_| Scalar::Null),
            Some(b'-' | b'0'..=b'9') => Ok(Scalar::Number(self.number()?)),
            Some(b) => self.error(format!("unexpected character '{}'", printable(b))),
            None => self.error("unexpected end of input, expected a value"),
        }
    }

    /// Iterates the keys of the object at the cursor: calls `f(key, cursor)` with the cursor
    /// at the value, which `f` must consume (e.g. with [`Cursor::value`]).
    pub fn object<F>(&mut self, mut f: F) -> Result<()>
    where
        F: FnMut(&str, &mut Cursor<'a>) -> Result<()>,
    {
        self.object_members(|_, key, c| f(key, c))
    }

    /// Like [`Self::object`], `f` also given where the member starts (its key's opening quote).
    pub fn object_members<F>(&mut self, mut f: F) -> Result<()>
    where
        F: FnMut(usize, &str, &mut Cursor<'a>) -> Result<()>,
    {
        self.expect(b'{')?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip_ws();
            let start = self.pos;
            let key = self.string()?;
            self.expect(b':')?;
            f(start, &key, self)?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b) => {
                    return self.error(format!(
                        "expected ',' or '}}' in object, found '{}'",
                        printable(b)
                    ))
                }
                None => return self.error("unexpected end of input inside an object"),
            }
        }
    }

    /// Reads `[x, y, z]` of three plain integers (as [`Cursor::plain_int`] reads them) in one
    /// pass, the cursor then after the `]`; `None`, the cursor where it was, for any other
    /// value, which [`Cursor::int_triple`] then reads. Launch geometry is written this way in
    /// every trace, twice per kernel.
    pub fn plain_int_triple(&mut self) -> Option<[i64; 3]> {
        // Read on a copy, which replaces the cursor only once the whole triple is read.
        let mut c = *self;
        if c.peek()? != b'[' {
            return None;
        }
        c.pos += 1;
        let mut triple = [0; 3];
        for (i, value) in triple.iter_mut().enumerate() {
            *value = c.plain_int()?;
            if c.peek()? != if i < 2 { b',' } else { b']' } {
                return None;
            }
            c.pos += 1;
        }
        *self = c;
        Some(triple)
    }

    /// Reads an array of up to three integers (`[132, 1, 1]`).
    pub fn int_triple(&mut self) -> Result<Option<[Option<i64>; 3]>> {
        match self.value()? {
            Scalar::Compound {
                start,
                end,
                object: false,
            } => {
                let mut out = [None; 3];
                let mut inner = self.sub(end, start + 1);
                let mut i = 0;
                loop {
                    match inner.peek() {
                        Some(b']') | None => break,
                        Some(b',') => inner.pos += 1,
                        _ => {
                            let v = inner.value()?;
                            if i < 3 {
                                out[i] = scalar_i64(&v);
                            }
                            i += 1;
                        }
                    }
                }
                Ok(Some(out))
            }
            _ => Ok(None),
        }
    }
}

fn printable(b: u8) -> char {
    if b.is_ascii_graphic() {
        b as char
    } else {
        '?'
    }
}

/// Offset one past the end of the object or array starting at `start`, or `None` if the buffer
/// ends first. Strings are skipped with their escapes.
///
/// 64 bytes at a time: bit masks of quotes and brackets (on x86-64 with AVX2 where the CPU has
/// it, else SSE2), the inside of strings as the running XOR of the quote mask (a carry-less
/// multiplication with AVX2), so that only brackets outside strings are visited. A chunk with
/// a backslash (rare in traces), or after one, goes byte by byte.
pub fn find_value_end(buf: &[u8], start: usize) -> Option<usize> {
    scan_value(buf, start).map(|(end, _)| end)
}

/// Like [`find_value_end`], for an object; also the span of its one member value that is an
/// object, if it has exactly one (a trace event's `args`), found in the same pass. The
/// parser then takes that member without scanning it again.
pub fn object_extent(buf: &[u8], start: usize) -> Option<(usize, Option<(usize, usize)>)> {
    if buf.get(start) != Some(&b'{') {
        return None;
    }
    scan_value(buf, start).map(|(end, scan)| (end, (scan.nested == 1).then_some(scan.nested_span)))
}

fn scan_value(buf: &[u8], start: usize) -> Option<(usize, BracketScan)> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("pclmulqdq") {
        // SAFETY: both features were just detected.
        return unsafe { scan_value_avx2(buf, start) };
    }
    scan_value_with::<Baseline>(buf, start)
}

/// [`scan_value`] compiled for AVX2 and carry-less multiplication, which the chunk masks
/// and the running XOR of quotes then use.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,pclmulqdq")]
unsafe fn scan_value_avx2(buf: &[u8], start: usize) -> Option<(usize, BracketScan)> {
    scan_value_with::<Avx2>(buf, start)
}

#[inline(always)]
fn scan_value_with<S: ChunkScan>(buf: &[u8], start: usize) -> Option<(usize, BracketScan)> {
    // Only the opening kind's brackets need counting: the other kind balances inside, and
    // strings (which may hold any bracket) are skipped whole.
    let (open, close) = match buf.get(start)? {
        b'{' => (b'{', b'}'),
        b'[' => (b'[', b']'),
        _ => return None,
    };
    let mut scan = BracketScan {
        open,
        close,
        depth: 0,
        in_string: false,
        escaped: false,
        base: start,
        nested: 0,
        nested_span: (0, 0),
    };
    let mut i = start;
    while i + 64 <= buf.len() {
        let chunk: &[u8; 64] = buf[i..i + 64].try_into().expect("64 bytes");
        // SAFETY: `scan_value` picks an `S` whose CPU features it has detected.
        let m = unsafe { S::masks(chunk, open, close) };
        scan.base = i;
        let found = if m.backslash != 0 || scan.escaped {
            scan.bytes(chunk)
        } else {
            // SAFETY: as above.
            scan.masks(&m, unsafe { S::prefix_xor(m.quote) })
        };
        if let Some(k) = found {
            return Some((i + k + 1, scan));
        }
        i += 64;
    }
    scan.base = i;
    let end = scan.bytes(&buf[i..])?;
    Some((i + end + 1, scan))
}

/// The state of [`find_value_end`] between chunks.
struct BracketScan {
    open: u8,
    close: u8,
    depth: usize,
    in_string: bool,
    /// The previous byte was a backslash inside a string.
    escaped: bool,
    /// Offset in the buffer of the chunk being scanned.
    base: usize,
    /// Brackets opened directly inside the value, and the span (open to one past the close)
    /// of the last of them.
    nested: u32,
    nested_span: (usize, usize),
}

impl BracketScan {
    /// Byte by byte; the offset in `bytes` of the bracket that closes the value, if there.
    fn bytes(&mut self, bytes: &[u8]) -> Option<usize> {
        for (k, &b) in bytes.iter().enumerate() {
            if self.escaped {
                self.escaped = false;
            } else if self.in_string {
                match b {
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
            } else if b == b'"' {
                self.in_string = true;
            } else if b == self.open {
                self.opened(k);
            } else if b == self.close && self.closed(k) {
                return Some(k);
            }
        }
        None
    }

    #[inline]
    fn opened(&mut self, k: usize) {
        if self.depth == 1 {
            self.nested += 1;
            self.nested_span.0 = self.base + k;
        }
        self.depth += 1;
    }

    /// Whether this close ends the value.
    #[inline]
    fn closed(&mut self, k: usize) -> bool {
        self.depth -= 1;
        if self.depth == 1 {
            self.nested_span.1 = self.base + k + 1;
        }
        self.depth == 0
    }

    /// A 64-byte chunk without backslashes, by its masks; bit k of `inside`: the chunk is
    /// within a string after byte k if it did not start within one (a quote toggles).
    #[inline(always)]
    fn masks(&mut self, m: &ChunkMasks, mut inside: u64) -> Option<usize> {
        if self.in_string {
            inside = !inside;
        }
        self.in_string = inside >> 63 == 1;
        let opens = m.open & !inside;
        let closes = m.close & !inside;
        // Deep inside the value, opens alone only count (none is directly inside it).
        if closes == 0 && (self.depth >= 2 || opens == 0) {
            self.depth += opens.count_ones() as usize;
            return None;
        }
        let mut brackets = opens | closes;
        while brackets != 0 {
            let k = brackets.trailing_zeros() as usize;
            brackets &= brackets - 1;
            if opens >> k & 1 == 1 {
                self.opened(k);
            } else if self.closed(k) {
                return Some(k);
            }
        }
        None
    }
}

/// Bit k set where byte k of a 64-byte chunk is a quote, a backslash, the open or the close
/// bracket.
struct ChunkMasks {
    quote: u64,
    backslash: u64,
    open: u64,
    close: u64,
}

/// How [`scan_value`] computes a chunk's masks and the running XOR of its quotes: with the
/// instructions every CPU of the target has ([`Baseline`]), or with AVX2 and carry-less
/// multiplication ([`Avx2`]).
trait ChunkScan {
    /// # Safety
    /// The CPU has the implementation's features.
    unsafe fn masks(chunk: &[u8; 64], open: u8, close: u8) -> ChunkMasks;
    /// Bit k of the result: the XOR of bits 0..=k of `x`.
    /// # Safety
    /// As for [`ChunkScan::masks`].
    unsafe fn prefix_xor(x: u64) -> u64;
}

struct Baseline;

impl ChunkScan for Baseline {
    #[inline(always)]
    unsafe fn masks(chunk: &[u8; 64], open: u8, close: u8) -> ChunkMasks {
        ChunkMasks::of(chunk, open, close)
    }

    #[inline(always)]
    unsafe fn prefix_xor(x: u64) -> u64 {
        prefix_xor(x)
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl ChunkScan for Avx2 {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn masks(chunk: &[u8; 64], open: u8, close: u8) -> ChunkMasks {
        use std::arch::x86_64::*;
        let lo = _mm256_loadu_si256(chunk.as_ptr() as *const __m256i);
        let hi = _mm256_loadu_si256(chunk.as_ptr().add(32) as *const __m256i);
        let mask = |b: u8| -> u64 {
            let b = _mm256_set1_epi8(b as i8);
            let lo = _mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, b)) as u32 as u64;
            let hi = _mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, b)) as u32 as u64;
            lo | hi << 32
        };
        ChunkMasks {
            quote: mask(b'"'),
            backslash: mask(b'\\'),
            open: mask(open),
            close: mask(close),
        }
    }

    /// One carry-less multiplication by all ones.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    unsafe fn prefix_xor(x: u64) -> u64 {
        use std::arch::x86_64::*;
        let product = _mm_clmulepi64_si128(_mm_set_epi64x(0, x as i64), _mm_set1_epi8(-1), 0);
        _mm_cvtsi128_si64(product) as u64
    }
}

impl ChunkMasks {
    #[cfg(target_arch = "x86_64")]
    fn of(chunk: &[u8; 64], open: u8, close: u8) -> ChunkMasks {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the loads read 4 x 16 bytes of a 64-byte array.
        unsafe {
            let mask = |v: __m128i, b: u8| -> u64 {
                _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8))) as u16 as u64
            };
            let mut m = ChunkMasks {
                quote: 0,
                backslash: 0,
                open: 0,
                close: 0,
            };
            for lane in 0..4 {
                let v = _mm_loadu_si128(chunk.as_ptr().add(16 * lane) as *const __m128i);
                let shift = 16 * lane;
                m.quote |= mask(v, b'"') << shift;
                m.backslash |= mask(v, b'\\') << shift;
                m.open |= mask(v, open) << shift;
                m.close |= mask(v, close) << shift;
            }
            m
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn of(chunk: &[u8; 64], open: u8, close: u8) -> ChunkMasks {
        let bits = |want: u8| {
            chunk
                .iter()
                .enumerate()
                .fold(0u64, |m, (k, &b)| m | ((b == want) as u64) << k)
        };
        ChunkMasks {
            quote: bits(b'"'),
            backslash: bits(b'\\'),
            open: bits(open),
            close: bits(close),
        }
    }
}

/// Offset of the first `"` or `\\` in `bytes`. Most strings of a trace (keys, short values)
/// end within 16 bytes: one SSE2 comparison finds that end, where a `memchr2` call costs more
/// to set up than the scan.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= 16 {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the load reads the first 16 of at least 16 bytes.
        let hits = unsafe {
            let v = _mm_loadu_si128(bytes.as_ptr() as *const __m128i);
            let q = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let b = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            _mm_movemask_epi8(_mm_or_si128(q, b)) as u32
        };
        if hits != 0 {
            return Some(hits.trailing_zeros() as usize);
        }
        return memchr::memchr2(b'"', b'\\', &bytes[16..]).map(|k| k + 16);
    }
    memchr::memchr2(b'"', b'\\', bytes)
}

/// Offset in `text` of a `}` that is followed, after whitespace only, by `,` and `{`: how
/// one element of an array of objects ends and the next begins. Inside one trace event this
/// only happens within a string or an array of objects in its `args`, or where a damaged
/// quote turned the events after it into the inside of a string that a second damaged quote
/// ends: the bracket scan then sees those events as part of this one's `args` (which the
/// parser does not read), and they would be lost. A hit is checked by
/// [`strictly_valid`]; the search itself runs at memchr speed over bytes already in cache.
pub fn element_boundary(text: &[u8]) -> Option<usize> {
    let after_ws = |mut j: usize| {
        while matches!(text.get(j), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            j += 1;
        }
        j
    };
    memchr::memchr_iter(b'}', text).find(|&i| {
        let comma = after_ws(i + 1);
        text.get(comma) == Some(&b',') && text.get(after_ws(comma + 1)) == Some(&b'{')
    })
}

/// Whether `text` is one JSON value and nothing else, checked token by token (strings,
/// escapes, numbers, literals, brackets): for the rare event whose raw text
/// [`element_boundary`] finds suspicious. The error: its offset in `text`, and what is wrong.
pub fn strictly_valid(text: &[u8]) -> std::result::Result<(), (usize, String)> {
    let e = match serde_json::from_slice::<serde::de::IgnoredAny>(text) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    // serde_json counts lines from 1 and bytes of a line from 1.
    let line_start = match e.line() {
        0 | 1 => 0,
        n => memchr::memchr_iter(b'\n', text)
            .nth(n - 2)
            .map_or(text.len(), |i| i + 1),
    };
    let at = (line_start + e.column().saturating_sub(1)).min(text.len());
    let message = e.to_string();
    let message = match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message,
    };
    Err((at, message))
}

/// Bit k of the result: the XOR of bits 0..=k of `x`.
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// Converts decimal microseconds (`"1695835572943613.123"`, `"12"`, `"1.5e3"`) to integer
/// nanoseconds exactly; digits beyond the nanosecond are rounded half away from zero.
pub fn us_to_ns(text: &str) -> Option<i64> {
    plain_us_to_ns(text.as_bytes()).or_else(|| decimal_scaled(text, 3))
}

/// The common shape of trace times, `digits[.digits]` with at most 3 decimals and 19 digits
/// (epoch microseconds with 3 decimals have 19), in `u64` arithmetic; `None` for anything
/// else, which [`decimal_scaled`] then reads (with `i128`, several times slower per digit).
#[inline]
fn plain_us_to_ns(bytes: &[u8]) -> Option<i64> {
    let mut number = PlainUs::default();
    for &b in bytes {
        if !number.take(b) {
            return None;
        }
    }
    number.ns()
}

/// The value of eight ASCII digits, or `None` when any of the bytes is not a digit: a
/// word at a time (SWAR, as simdjson does) instead of eight steps of a byte.
#[inline]
fn eight_digits(bytes: &[u8]) -> Option<u64> {
    const HIGH: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    let v = u64::from_le_bytes(bytes.try_into().ok()?);
    // Every byte 0x30..=0x3F, and still so when 6 is added: 0x30..=0x39. A byte that carries
    // into the next one (0xFA and up) fails the first test itself.
    if (v & HIGH) | ((v.wrapping_add(0x0606_0606_0606_0606) & HIGH) >> 4) != 0x3333_3333_3333_3333 {
        return None;
    }
    // Pairs of digits, then fours, then the eight (the first digit is the lowest byte).
    let v = (v & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(10 << 8 | 1) >> 8;
    let v = (v & 0x00FF_00FF_00FF_00FF).wrapping_mul(100 << 16 | 1) >> 16;
    Some((v & 0x0000_FFFF_0000_FFFF).wrapping_mul(10_000 << 32 | 1) >> 32)
}

/// Decimal microseconds of the plain shape ([`plain_us_to_ns`]), read a byte at a time.
#[derive(Default)]
struct PlainUs {
    value: u64,
    digits: u32,
    decimals: Option<u32>,
}

impl PlainUs {
    /// Adds `b`; false when `b` cannot continue a plain number (it is left out).
    #[inline]
    fn take(&mut self, b: u8) -> bool {
        match b {
            // 19 digits stay below 10^19 < 2^64.
            b'0'..=b'9' if self.digits < 19 => {
                self.value = self.value * 10 + (b - b'0') as u64;
                self.digits += 1;
                if let Some(d) = &mut self.decimals {
                    *d += 1;
                }
                true
            }
            b'.' if self.decimals.is_none() => {
                self.decimals = Some(0);
                true
            }
            _ => false,
        }
    }

    /// The nanoseconds read, if there are digits and at most 3 decimals.
    #[inline]
    fn ns(&self) -> Option<i64> {
        let decimals = self.decimals.unwrap_or(0);
        if self.digits == 0 || decimals > 3 {
            return None;
        }
        i64::try_from(self.value.checked_mul(10u64.pow(3 - decimals))?).ok()
    }
}

/// `text * 10^scale` as an integer, exactly (rounded half away from zero).
pub fn decimal_scaled(text: &str, scale: i32) -> Option<i64> {
    let bytes = text.as_bytes();
    let (neg, mut i) = match bytes.first()? {
        b'-' => (true, 1),
        b'+' => (false, 1),
        _ => (false, 0),
    };
    let mut mantissa: i128 = 0;
    let mut exp: i32 = scale;
    let mut digits = 0;
    let mut seen_dot = false;
    while i < bytes.len() {
        match bytes[i] {
            b'0'..=b'9' => {
                if digits < 36 {
                    mantissa = mantissa * 10 + (bytes[i] - b'0') as i128;
                    if seen_dot {
                        exp -= 1;
                    }
                } else if !seen_dot {
                    exp += 1;
                }
                digits += 1;
            }
            b'.' if !seen_dot => seen_dot = true,
            b'e' | b'E' => {
                let e: i32 = text[i + 1..].parse().ok()?;
                exp = exp.checked_add(e)?;
                break;
            }
            _ => return None,
        }
        i += 1;
    }
    if digits == 0 {
        return None;
    }
    let value = if exp >= 0 {
        mantissa.checked_mul(10i128.checked_pow(exp as u32)?)?
    } else {
        let div = 10i128.checked_pow((-exp) as u32).unwrap_or(i128::MAX);
        let q = mantissa / div;
        let r = mantissa % div;
        if r * 2 >= div {
            q + 1
        } else {
            q
        }
    };
    let value = if neg { -value } else { value };
    i64::try_from(value).ok()
}

/// An integer from a number or a numeric string (`7`, `"7"`, `"0x1f"`, `7.0`).
pub fn scalar_i64(v: &Scalar<'_>) -> Option<i64> {
    match v {
        Scalar::Number(n) => n.parse::<i64>().ok().or_else(|| decimal_scaled(n, 0)),
        Scalar::Str(s) => parse_int_text(s),
        Scalar::Bool(b) => Some(*b as i64),
        _ => None,
    }
}

/// Integers written as text: decimal, `0x` hex, or the last number in `"stream 7"`.
pub fn parse_int_text(s: &str) -> Option<i64> {
    let t = s.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return i64::from_str_radix(hex, 16).ok();
    }
    if let Ok(v) = t.parse::<i64>() {
        return Some(v);
    }
    let tail = t.rsplit(|c: char| !c.is_ascii_digit()).next()?;
    if tail.is_empty() || tail.len() == t.len() {
        None
    } else {
        tail.parse().ok()
    }
}

pub fn scalar_f64(v: &Scalar<'_>) -> Option<f64> {
    match v {
        Scalar::Number(n) => n.parse().ok(),
        Scalar::Str(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
