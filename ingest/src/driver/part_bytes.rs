//! Keeping a part's string columns under Arrow's limit: a part's batches are gathered into
//! one array per column when the part is sorted, and a string array addresses its bytes with
//! 32-bit offsets (2 GiB). Parts are cut by rows ([`crate::driver::PART_ROWS`]); rows with
//! long `args` (up to [`crate::columns::MAX_ARGS_BYTES`] each) could pass 2 GiB in far fewer
//! rows, so a part's batches are also cut where their string bytes reach
//! [`PART_STRING_BYTES`].

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int32Type};

/// String bytes one part holds at most (a batch alone larger than this is a part of its
/// own). Real parts hold tens of MB.
pub const PART_STRING_BYTES: usize = 1 << 30;

/// Bytes of text in `batch`'s string columns: their values, and the dictionaries of its
/// dictionary-encoded ones (which sorting concatenates too).
pub fn string_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8 => text_bytes(c.as_ref()),
            DataType::Dictionary(_, value) if **value == DataType::Utf8 => c
                .as_dictionary_opt::<Int32Type>()
                .map_or(0, |d| text_bytes(d.values().as_ref())),
            _ => 0,
        })
        .sum()
}

/// Bytes between the first and last offsets of a string array (a slice's own bytes only).
fn text_bytes(array: &dyn Array) -> usize {
    let offsets = array.as_string::<i32>().value_offsets();
    match (offsets.first(), offsets.last()) {
        (Some(&a), Some(&b)) => (b - a).max(0) as usize,
        _ => 0,
    }
}

/// `batches` in order, in groups of at most `limit` string bytes each (a batch over the limit
/// alone); one group when they are under it, as nearly always, none when there are none.
pub fn split(batches: Vec<RecordBatch>, limit: usize) -> Vec<Vec<RecordBatch>> {
    let mut groups: Vec<Vec<RecordBatch>> = vec![Vec::new()];
    let mut bytes = 0;
    for b in batches {
        let n = string_bytes(&b);
        let current = groups.last_mut().expect("one group at least");
        if !current.is_empty() && bytes + n > limit {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += n;
        groups.last_mut().expect("one group at least").push(b);
    }
    groups.retain(|g| !g.is_empty());
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::{Event, EventColumns, Kind};

    fn batch(args_len: usize, rows: usize) -> RecordBatch {
        let args = "x".repeat(args_len);
        let mut cols = EventColumns::with_capacity(rows);
        for i in 0..rows {
            cols.push(
                Kind::CpuOp,
                &Event {
                    name: "op",
                    ts: i as i64,
                    args: Some(&args),
                    ..Default::default()
                },
            );
        }
        cols.finish()
    }

    #[test]
    fn batches_are_cut_where_their_strings_reach_the_limit() {
        let b = batch(1000, 10);
        // 10 rows of 1000 bytes of args, and a few bytes of names and kinds (dictionaries).
        let whole = string_bytes(&b);
        assert!((10_000..10_200).contains(&whole), "{whole}");
        let slice = string_bytes(&b.slice(2, 3));
        assert!((3_000..3_200).contains(&slice), "{slice}");
        let groups = split(vec![b.clone(), b.clone(), b.clone()], 25_000);
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
        let groups = split(vec![b.clone(), b.clone()], 5_000);
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 1]);
        assert_eq!(split(vec![b.clone()], PART_STRING_BYTES).len(), 1);
        assert!(split(Vec::new(), 1).is_empty());
    }
}
