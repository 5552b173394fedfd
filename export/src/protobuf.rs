//! The few protobuf encodings Perfetto's trace format needs: varints, fixed64, doubles and
//! length-delimited fields. A generated binding of Perfetto's 398 `.proto` files
//! (`perfetto_protos`, rust-protobuf with a vendored `protoc`) would be megabytes of code for
//! the ten messages written here, and `prost` is not in the dependency tree.

/// Wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;

/// A message being written: its bytes so far.
#[derive(Default)]
pub struct Message {
    pub buf: Vec<u8>,
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

impl Message {
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    fn key(&mut self, field: u32, wire: u64) {
        varint(&mut self.buf, (field as u64) << 3 | wire);
    }

    /// An unsigned or non-negative integer field (`uint64`, `uint32`, `int32` >= 0, enums).
    pub fn uint(&mut self, field: u32, v: u64) {
        self.key(field, VARINT);
        varint(&mut self.buf, v);
    }

    /// A signed `int64`/`int32` field (two's complement, as protobuf encodes them).
    pub fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    pub fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn double(&mut self, field: u32, v: f64) {
        self.fixed64(field, v.to_bits());
    }

    pub fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, LEN);
        varint(&mut self.buf, b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    pub fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    /// Writes this message as length-delimited field `field` of its parent straight to
    /// `out` (a `Trace`'s packets are written as they are made, never held together).
    pub fn write_as_field(&self, field: u32, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(12);
        varint(&mut head, (field as u64) << 3 | LEN);
        varint(&mut head, self.buf.len() as u64);
        out.write_all(&head)?;
        out.write_all(&self.buf)
    }

    /// A nested message field, written by `f` into `scratch` (kept for reuse).
    pub fn message(&mut self, field: u32, scratch: &mut Message, f: impl FnOnce(&mut Message)) {
        scratch.clear();
        f(scratch);
        self.bytes(field, &scratch.buf);
    }
}

/// Reads fields back (for tests and for checking what was written): (field, wire type,
/// value or bytes).
#[cfg(test)]
pub fn fields(mut b: &[u8]) -> Vec<(u32, u64, u64, Vec<u8>)> {
    fn read_varint(b: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let byte = b[0];
            *b = &b[1..];
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = read_varint(&mut b);
        let (field, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            VARINT => out.push((field, wire, read_varint(&mut b), Vec::new())),
            FIXED64 => {
                let v = u64::from_le_bytes(b[..8].try_into().unwrap());
                b = &b[8..];
                out.push((field, wire, v, Vec::new()));
            }
            LEN => {
                let n = read_varint(&mut b) as usize;
                out.push((field, wire, n as u64, b[..n].to_vec()));
                b = &b[n..];
            }
            w => panic!("wire type {w}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_as_written() {
        let mut m = Message::default();
        let mut scratch = Message::default();
        m.uint(8, 1_700_000_000_123_456_789);
        m.int(1, -1);
        m.fixed64(47, u64::MAX - 3);
        m.double(44, 2.5);
        m.message(11, &mut scratch, |e| {
            e.uint(9, 1);
            e.string(23, "gemm");
        });
        let f = fields(&m.buf);
        assert_eq!(f[0], (8, 0, 1_700_000_000_123_456_789, vec![]));
        assert_eq!(f[1].2, u64::MAX);
        assert_eq!(f[2].2, u64::MAX - 3);
        assert_eq!(f[3].2, 2.5f64.to_bits());
        let inner = fields(&f[4].3);
        assert_eq!(inner[0], (9, 0, 1, vec![]));
        assert_eq!(inner[1].3, b"gemm");
        // 300 takes two bytes: 0xAC 0x02.
        let mut v = Message::default();
        v.uint(1, 300);
        assert_eq!(v.buf, [0x08, 0xAC, 0x02]);
    }
}
