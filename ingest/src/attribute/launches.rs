//! Launch calls with their attribution, looked up by the GPU work they launched.
//!
//! A launch is attributed once, where its host ranges are at hand: the innermost operator and
//! annotation around it and the step it ran in ([`AttributedLaunch`]). GPU rows then find their
//! launch by process and correlation id and take those values as they are.
//!
//! The launches of a file wait either in memory ([`Launches::Memory`]) or, when the file's
//! host rows are attributed a window at a time, in a [`LaunchIndex`]: one sorted run per
//! window, in blocks of 512 launches encoded as varint deltas (about 6 bytes a launch instead
//! of 32). The blocks stay in memory up to a budget and go to a scratch file past it; only the
//! first key of each block stays in memory then. Looking a batch of GPU rows up decodes just
//! the blocks holding their keys, so memory does not grow with the number of launches.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Default bytes of encoded launches held in memory before they go to the scratch file
/// (about 2.5 M launches).
pub const DEFAULT_MEMORY_BUDGET: usize = 16 << 20;

/// A launch's key: (pid, correlation id).
pub type Key = (i64, i64);

/// Marks an absent operator or annotation name id.
pub const NO_NAME: u32 = u32::MAX;
/// Marks an absent step.
const NO_STEP: i64 = i64::MIN;

/// A launch call's correlation key and what GPU work launched by it is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttributedLaunch {
    pub correlation: i64,
    /// The launching process when correlation ids are unique per process only, else 0.
    pub pid: i64,
    step: i64,
    /// Name ids of the innermost operator and annotation around the launch call.
    op: u32,
    scope: u32,
}

/// Launches per block: the unit encoded, read and decoded.
const BLOCK: usize = 512;

impl AttributedLaunch {
    pub fn new(
        correlation: i64,
        pid: i64,
        step: Option<i64>,
        op: Option<u32>,
        scope: Option<u32>,
    ) -> AttributedLaunch {
        AttributedLaunch {
            correlation,
            pid,
            step: step.unwrap_or(NO_STEP),
            op: op.unwrap_or(NO_NAME),
            scope: scope.unwrap_or(NO_NAME),
        }
    }

    /// (pid, correlation id): the launches of one process sort together, so the runs of
    /// per-process windows cover ranges of keys of their own.
    pub fn key(&self) -> Key {
        (self.pid, self.correlation)
    }

    pub fn step(&self) -> Option<i64> {
        (self.step != NO_STEP).then_some(self.step)
    }

    pub fn op(&self) -> Option<u32> {
        (self.op != NO_NAME).then_some(self.op)
    }

    pub fn scope(&self) -> Option<u32> {
        (self.scope != NO_NAME).then_some(self.scope)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> io::Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or_else(damaged)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(damaged())
}

fn damaged() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "damaged launch index block")
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Appends a block: each launch's fields as zigzag varint differences from the launch before
/// (from zeros for the first). Sorted launches of one process differ by small steps.
fn encode_block(launches: &[AttributedLaunch], out: &mut Vec<u8>) {
    let mut prev = [0i64; 5];
    for l in launches {
        let fields = [
            l.pid,
            l.correlation,
            l.step,
            i64::from(l.op),
            i64::from(l.scope),
        ];
        for (f, p) in fields.iter().zip(prev.iter_mut()) {
            put_varint(out, zigzag(f.wrapping_sub(*p)));
            *p = *f;
        }
    }
}

fn decode_block(bytes: &[u8], len: usize, out: &mut Vec<AttributedLaunch>) -> io::Result<()> {
    out.clear();
    let mut at = 0;
    let mut prev = [0i64; 5];
    for _ in 0..len {
        for p in prev.iter_mut() {
            *p = p.wrapping_add(unzigzag(get_varint(bytes, &mut at)?));
        }
        let name = |v: i64| u32::try_from(v).map_err(|_| damaged());
        out.push(AttributedLaunch {
            pid: prev[0],
            correlation: prev[1],
            step: prev[2],
            op: name(prev[3])?,
            scope: name(prev[4])?,
        });
    }
    Ok(())
}

/// Where GPU rows find their launches.
pub enum Launches {
    /// Sorted by key, one per key.
    Memory(Vec<AttributedLaunch>),
    Index(LaunchIndex),
}

impl Launches {
    /// The launch of each key, a key being (pid, correlation id) as [`AttributedLaunch::key`]
    /// (`None` keys and keys without a launch give `None`).
    pub fn find_all(&self, keys: &[Option<Key>]) -> io::Result<Vec<Option<AttributedLaunch>>> {
        match self {
            Launches::Memory(launches) => {
                // Keys come mostly in rising order: each search starts where the last ended.
                let mut hint = 0;
                Ok(keys
                    .iter()
                    .map(|key| {
                        let key = (*key)?;
                        let i =
                            crate::attribute::search::partition_point_near(launches, hint, |l| {
                                l.key() < key
                            });
                        hint = i;
                        launches.get(i).filter(|l| l.key() == key).copied()
                    })
                    .collect())
            }
            Launches::Index(index) => index.find_all(keys),
        }
    }
}

/// One sorted run of a [`LaunchIndex`].
struct Run {
    len: usize,
    /// Offset of each block in the index's bytes, and where the last one ends.
    block_offsets: Vec<u64>,
    /// The key of the first launch of every block.
    block_keys: Vec<Key>,
    last_key: Key,
}

/// Where a [`LaunchIndex`]'s encoded blocks are.
enum Bytes {
    Memory(Vec<u8>),
    /// A scratch file, removed with the index.
    File(File, PathBuf),
}

/// Collects the sorted runs of a [`LaunchIndex`].
pub struct LaunchIndexWriter {
    /// Where the blocks go once they pass the budget.
    path: PathBuf,
    budget: usize,
    memory: Vec<u8>,
    file: Option<File>,
    /// Bytes written to the file.
    spilled: u64,
    runs: Vec<Run>,
}

impl LaunchIndexWriter {
    /// An empty index whose blocks stay in memory up to `budget` bytes and all go to a
    /// scratch file at `path` past it.
    pub fn new(path: PathBuf, budget: usize) -> LaunchIndexWriter {
        LaunchIndexWriter {
            path,
            budget,
            memory: Vec::new(),
            file: None,
            spilled: 0,
            runs: Vec::new(),
        }
    }

    /// Appends a run; `launches` must be sorted by key with one launch per key. Where runs
    /// share a key, the earlier run's launch is found.
    pub fn push_run(&mut self, launches: &[AttributedLaunch]) -> io::Result<()> {
        let Some(last) = launches.last() else {
            return Ok(());
        };
        debug_assert!(launches.windows(2).all(|w| w[0].key() < w[1].key()));
        let base = self.spilled + self.memory.len() as u64;
        let start = self.memory.len();
        let mut block_offsets = Vec::with_capacity(launches.len() / BLOCK + 2);
        for block in launches.chunks(BLOCK) {
            block_offsets.push(base + (self.memory.len() - start) as u64);
            encode_block(block, &mut self.memory);
        }
        block_offsets.push(base + (self.memory.len() - start) as u64);
        self.runs.push(Run {
            len: launches.len(),
            block_offsets,
            block_keys: launches.iter().step_by(BLOCK).map(|l| l.key()).collect(),
            last_key: last.key(),
        });
        if self.file.is_some() || self.memory.len() > self.budget {
            let file = match &mut self.file {
                Some(file) => file,
                None => self.file.insert(File::create(&self.path)?),
            };
            file.write_all(&self.memory)?;
            self.spilled += self.memory.len() as u64;
            self.memory.clear();
            self.memory.shrink_to(1 << 20);
        }
        Ok(())
    }

    /// The scratch file the blocks go to past the budget.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn finish(mut self) -> io::Result<LaunchIndex> {
        let bytes = match self.file.take() {
            Some(file) => {
                drop(file);
                let path = std::mem::take(&mut self.path);
                Bytes::File(File::open(&path)?, path)
            }
            None => Bytes::Memory(std::mem::take(&mut self.memory)),
        };
        Ok(LaunchIndex::new(bytes, std::mem::take(&mut self.runs)))
    }
}

impl Drop for LaunchIndexWriter {
    /// An unfinished index (an ingest that failed) leaves no scratch file behind.
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Attributed launches in sorted runs; see the module documentation.
pub struct LaunchIndex {
    bytes: Bytes,
    runs: Vec<Run>,
    /// Run indices sorted by first key, and the greatest last key of the runs up to each.
    by_first: Vec<(usize, Key)>,
    /// By run: whether another run's key range meets its range.
    overlapping: Vec<bool>,
}

impl LaunchIndex {
    fn new(bytes: Bytes, runs: Vec<Run>) -> LaunchIndex {
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by_key(|&r| runs[r].block_keys[0]);
        let meet =
            |a: &Run, b: &Run| a.block_keys[0] <= b.last_key && b.block_keys[0] <= a.last_key;
        let overlapping = (0..runs.len())
            .map(|r| (0..runs.len()).any(|s| s != r && meet(&runs[r], &runs[s])))
            .collect();
        let mut reach = (i64::MIN, i64::MIN);
        let by_first = order
            .into_iter()
            .map(|r| {
                reach = reach.max(runs[r].last_key);
                (r, reach)
            })
            .collect();
        LaunchIndex {
            bytes,
            runs,
            by_first,
            overlapping,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Whether the blocks went to the scratch file.
    #[cfg(test)]
    fn spilled(&self) -> bool {
        matches!(self.bytes, Bytes::File(..))
    }

    /// Decodes block `b` of run `r` into `out`.
    fn read_block(
        &self,
        r: usize,
        b: usize,
        buf: &mut Vec<u8>,
        out: &mut Vec<AttributedLaunch>,
    ) -> io::Result<()> {
        let run = &self.runs[r];
        let (start, end) = (run.block_offsets[b], run.block_offsets[b + 1]);
        let len = BLOCK.min(run.len - b * BLOCK);
        match &self.bytes {
            Bytes::Memory(bytes) => decode_block(&bytes[start as usize..end as usize], len, out),
            Bytes::File(file, _) => {
                buf.resize((end - start) as usize, 0);
                file.read_exact_at(buf, start)?;
                decode_block(buf, len, out)
            }
        }
    }

    /// [`Launches::find_all`]. GPU rows come roughly in launch order: each run keeps the
    /// block it read last, and most keys are found in the block of the key before.
    pub fn find_all(&self, keys: &[Option<Key>]) -> io::Result<Vec<Option<AttributedLaunch>>> {
        // Per run: the block loaded last (index and launches).
        let mut loaded: Vec<Option<(usize, Vec<AttributedLaunch>)>> = Vec::new();
        loaded.resize_with(self.runs.len(), || None);
        let mut buf: Vec<u8> = Vec::new();
        let mut candidates: Vec<usize> = Vec::new();
        let mut found = Vec::with_capacity(keys.len());
        // The block the last key was found in, when its run shares its keys with no other
        // run: the next key is most likely in it too.
        let mut last: Option<(usize, Key, Key)> = None;
        for key in keys {
            let Some(key) = *key else {
                found.push(None);
                continue;
            };
            if let Some((r, _, _)) = last.filter(|&(_, lo, hi)| lo <= key && key <= hi) {
                let (_, block) = loaded[r].as_ref().expect("the last block is loaded");
                found.push(
                    block
                        .binary_search_by_key(&key, AttributedLaunch::key)
                        .ok()
                        .map(|i| block[i]),
                );
                continue;
            }
            // The runs whose key range holds the key; where several do, the earliest wins.
            candidates.clear();
            let mut j = self
                .by_first
                .partition_point(|&(r, _)| self.runs[r].block_keys[0] <= key);
            while j > 0 && self.by_first[j - 1].1 >= key {
                j -= 1;
                let r = self.by_first[j].0;
                if self.runs[r].last_key >= key {
                    candidates.push(r);
                }
            }
            candidates.sort_unstable();
            let mut launch = None;
            for &r in &candidates {
                let b = self.runs[r].block_keys.partition_point(|k| *k <= key) - 1;
                if loaded[r].as_ref().map(|(at, _)| *at) != Some(b) {
                    let mut block = loaded[r].take().map(|(_, v)| v).unwrap_or_default();
                    self.read_block(r, b, &mut buf, &mut block)?;
                    loaded[r] = Some((b, block));
                }
                let (_, block) = loaded[r].as_ref().expect("loaded above");
                if candidates.len() == 1 && !self.overlapping[r] {
                    last = Some((r, block[0].key(), block[block.len() - 1].key()));
                }
                if let Ok(i) = block.binary_search_by_key(&key, AttributedLaunch::key) {
                    launch = Some(block[i]);
                    break;
                }
            }
            found.push(launch);
        }
        Ok(found)
    }
}

impl Drop for LaunchIndex {
    fn drop(&mut self) {
        if let Bytes::File(_, path) = &self.bytes {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests;
