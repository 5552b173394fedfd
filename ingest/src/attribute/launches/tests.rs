//! The launch index: lookups against a sorted reference, in memory and spilled.

use super::*;
use std::collections::HashMap;

/// Sorted by key, one per key: the first of equal keys in `launches`' order.
fn sort_unique(launches: &mut Vec<AttributedLaunch>) {
    launches.sort_by_key(AttributedLaunch::key);
    launches.dedup_by_key(|l| l.key());
}

fn launch(correlation: i64, pid: i64, n: i64) -> AttributedLaunch {
    AttributedLaunch::new(
        correlation,
        pid,
        (n % 3 != 0).then_some(n),
        (n % 5 != 0).then_some(n as u32),
        Some(n as u32 + 1),
    )
}

#[test]
fn a_block_survives_encoding_with_extreme_and_absent_values() {
    let launches = vec![
        launch(7, 2, 15),
        launch(-1, 0, 4),
        AttributedLaunch::new(1, 1, None, None, None),
        AttributedLaunch::new(
            i64::MAX,
            i64::MIN,
            Some(i64::MAX),
            Some(0),
            Some(u32::MAX - 1),
        ),
        AttributedLaunch::new(i64::MIN, i64::MAX, Some(-3), None, Some(5)),
    ];
    let mut bytes = Vec::new();
    encode_block(&launches, &mut bytes);
    let mut back = Vec::new();
    decode_block(&bytes, launches.len(), &mut back).unwrap();
    assert_eq!(back, launches);
    // A cut block is an error, not a shorter or made-up block.
    let err = decode_block(&bytes[..bytes.len() - 1], launches.len(), &mut back).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    // Neighbouring launches of one process cost a few bytes each.
    let run: Vec<AttributedLaunch> = (0..512).map(|c| launch(1000 + c, 77, 4)).collect();
    bytes.clear();
    encode_block(&run, &mut bytes);
    assert!(bytes.len() < 512 * 8, "{} bytes", bytes.len());
    let none = AttributedLaunch::new(1, 1, None, None, None);
    assert_eq!((none.step(), none.op(), none.scope()), (None, None, None));
    let some = launch(7, 2, 7);
    assert_eq!(
        (some.step(), some.op(), some.scope()),
        (Some(7), Some(7), Some(8))
    );
}

/// Runs over overlapping key ranges, with a key in two runs, held in memory or spilled:
/// every lookup, in any order, equals a map of the first launch of each key, and what the
/// launches sorted in memory give.
#[test]
fn the_index_finds_what_a_map_of_first_launches_finds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("launches");
    for budget in [0, DEFAULT_MEMORY_BUDGET] {
        let mut writer = LaunchIndexWriter::new(path.clone(), budget);
        let mut oracle: HashMap<(i64, i64), AttributedLaunch> = HashMap::new();
        let mut all = Vec::new();
        let mut n = 0;
        for (lo, hi) in [(0i64, 3000i64), (2500, 2600), (9000, 12000), (100, 101)] {
            let mut run: Vec<AttributedLaunch> = (lo..hi)
                .flat_map(|c| [(c, 1), (c, 2)])
                .map(|(c, p)| {
                    n += 1;
                    launch(c, p, n)
                })
                .collect();
            sort_unique(&mut run);
            for l in &run {
                oracle.entry(l.key()).or_insert(*l);
            }
            all.extend(run.iter().copied());
            writer.push_run(&run).unwrap();
        }
        let index = writer.finish().unwrap();
        assert_eq!(index.len(), all.len());
        assert_eq!(index.spilled(), budget == 0);
        assert_eq!(path.exists(), budget == 0);
        let mut memory = all.clone();
        sort_unique(&mut memory);
        let memory = Launches::Memory(memory);
        let mut keys: Vec<Option<(i64, i64)>> = (-5..13000)
            .step_by(7)
            .flat_map(|c| [Some((1, c)), None, Some((2, c)), Some((3, c))])
            .chain([Some((1, 2550)), Some((2, 100)), Some((1, i64::MAX))])
            .collect();
        let want = |keys: &[Option<(i64, i64)>]| -> Vec<Option<AttributedLaunch>> {
            keys.iter()
                .map(|k| k.and_then(|k| oracle.get(&k).copied()))
                .collect()
        };
        assert!(want(&keys).iter().filter(|w| w.is_some()).count() > 1000);
        assert_eq!(index.find_all(&keys).unwrap(), want(&keys));
        assert_eq!(memory.find_all(&keys).unwrap(), want(&keys));
        keys.reverse();
        assert_eq!(index.find_all(&keys).unwrap(), want(&keys));
        keys.sort();
        assert_eq!(index.find_all(&keys).unwrap(), want(&keys));
        assert_eq!(memory.find_all(&keys).unwrap(), want(&keys));
        drop(index);
        assert!(!path.exists(), "the scratch file goes with the index");
    }
}
