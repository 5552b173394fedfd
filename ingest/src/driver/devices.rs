//! Naming the GPUs a trace's events use from its `deviceProperties`, including when the
//! entries are numbered differently from the events (visible devices renumbered by
//! `CUDA_VISIBLE_DEVICES` / `ROCR_VISIBLE_DEVICES`).

use std::collections::BTreeMap;

/// Names of the devices `used` by events (sorted, distinct), from `deviceProperties` entries
/// `(id, name)`, and a warning when the names are a guess or missing. The rules, in order:
/// 1. every used device has an entry of the same id: each takes that entry's name;
/// 2. the entries all name the same GPU: every used device has that name (one model per node);
/// 3. as many entries as used devices: the entries in order of id name the used devices in
///    order of id (a process that sees devices 4..7 lists them as 0..3), with a warning when
///    the names differ (which is which is then inferred from the order alone);
/// 4. otherwise the devices whose id has an entry take its name, the others stay unnamed, with
///    a warning.
pub fn device_names(
    entries: &[(i64, String)],
    used: &[i64],
) -> (BTreeMap<i64, String>, Option<String>) {
    let by_id: BTreeMap<i64, &str> = entries.iter().map(|(i, n)| (*i, n.as_str())).collect();
    let named_by_id = |ids: &[i64]| -> BTreeMap<i64, String> {
        ids.iter()
            .filter_map(|i| by_id.get(i).map(|n| (*i, n.to_string())))
            .collect()
    };
    if entries.is_empty() || used.iter().all(|i| by_id.contains_key(i)) {
        return (named_by_id(used), None);
    }
    let listed: Vec<i64> = by_id.keys().copied().collect();
    let mismatch =
        format!("deviceProperties lists devices {listed:?} but events use devices {used:?}");
    let mut names = by_id.values();
    let first = names.next().copied().unwrap_or_default();
    if names.all(|n| *n == first) {
        let all = used.iter().map(|i| (*i, first.to_string())).collect();
        return (all, None);
    }
    if by_id.len() == used.len() {
        let in_order = used
            .iter()
            .zip(by_id.values())
            .map(|(i, n)| (*i, n.to_string()))
            .collect();
        return (
            in_order,
            Some(format!(
                "{mismatch}: GPUs named in order of id (visible devices renumbered)"
            )),
        );
    }
    (
        named_by_id(used),
        Some(format!("{mismatch}: the others are unnamed")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(i64, &str)]) -> Vec<(i64, String)> {
        list.iter().map(|(i, n)| (*i, n.to_string())).collect()
    }

    #[test]
    fn renumbered_visible_devices_are_named() {
        let h100 = "NVIDIA H100 80GB HBM3";
        // Ids as the events use them: by id, no warning.
        let (names, warning) = device_names(&entries(&[(0, h100), (1, "A100")]), &[1]);
        assert_eq!(names, BTreeMap::from([(1, "A100".to_string())]));
        assert_eq!(warning, None);
        // One entry with id 0, every event on device 5 (CUDA_VISIBLE_DEVICES=5).
        let (names, warning) = device_names(&entries(&[(0, h100)]), &[5]);
        assert_eq!(names, BTreeMap::from([(5, h100.to_string())]));
        assert_eq!(warning, None);
        // Four identical GPUs listed 0..3, events on 4..7.
        let four = entries(&[(0, h100), (1, h100), (2, h100), (3, h100)]);
        let (names, warning) = device_names(&four, &[4, 5, 6, 7]);
        assert_eq!(names.len(), 4);
        assert!(names.values().all(|n| n == h100));
        assert_eq!(warning, None);
        // Different GPUs, as many as used: in order of id, with a warning.
        let (names, warning) = device_names(&entries(&[(1, "B"), (0, "A")]), &[2, 6]);
        assert_eq!(
            names,
            BTreeMap::from([(2, "A".to_string()), (6, "B".to_string())])
        );
        assert!(warning.unwrap().contains("in order of id"));
        // Different GPUs, counts differ: only matching ids are named, with a warning.
        let (names, warning) = device_names(&entries(&[(0, "A"), (1, "B"), (2, "C")]), &[1, 7]);
        assert_eq!(names, BTreeMap::from([(1, "B".to_string())]));
        let warning = warning.unwrap();
        assert!(
            warning.contains("[0, 1, 2]")
                && warning.contains("[1, 7]")
                && warning.contains("unnamed"),
            "{warning}"
        );
        // No entries: nothing named, nothing to warn about.
        assert_eq!(device_names(&[], &[0]), (BTreeMap::new(), None));
    }
}
