//! Perfetto's protobuf trace format: a `Trace` is a stream of `TracePacket`s (field 1), each
//! written as it is made. One packet sequence; event names are interned (sent once, then
//! referred to by id), which makes a kernel slice ~60 bytes instead of Chrome JSON's ~260.
//! Slices are a begin and an end event on their track; within a batch they are written in
//! time order per track, ends before begins at the same time and longer slices first, so that
//! nesting is what the rows say. Field numbers are Perfetto's (`perfetto_trace.proto`),
//! checked in the tests by decoding with Perfetto's own Python bindings.

use crate::protobuf::Message;
use crate::{Arg, Args, Item, Track, Writer};
use std::collections::HashMap;
use std::io::{self, Write};

/// `TracePacket` fields.
mod packet {
    pub const TIMESTAMP: u32 = 8;
    pub const SEQUENCE_ID: u32 = 10;
    pub const TRACK_EVENT: u32 = 11;
    pub const INTERNED_DATA: u32 = 12;
    pub const SEQUENCE_FLAGS: u32 = 13;
    pub const TRACK_DESCRIPTOR: u32 = 60;
    pub const INCREMENTAL_STATE_CLEARED: u64 = 1;
    pub const NEEDS_INCREMENTAL_STATE: u64 = 2;
}

/// `TrackEvent` fields and types.
mod event {
    pub const DEBUG_ANNOTATIONS: u32 = 4;
    pub const TYPE: u32 = 9;
    pub const NAME_IID: u32 = 10;
    pub const TRACK_UUID: u32 = 11;
    pub const CATEGORIES: u32 = 22;
    pub const DOUBLE_COUNTER_VALUE: u32 = 44;
    pub const FLOW_IDS: u32 = 47;
    pub const TERMINATING_FLOW_IDS: u32 = 48;
    pub const SLICE_BEGIN: u64 = 1;
    pub const SLICE_END: u64 = 2;
    pub const INSTANT: u64 = 3;
    pub const COUNTER: u64 = 4;
}

/// `Trace.packet`.
const TRACE_PACKET: u32 = 1;

/// The one packet sequence this writer uses.
const SEQUENCE: u64 = 1;

pub struct PerfettoWriter<'a> {
    out: io::BufWriter<&'a mut (dyn Write + Send)>,
    tracks: HashMap<Track, u64, ahash::RandomState>,
    processes: HashMap<Option<i32>, u64>,
    names: HashMap<String, u64, ahash::RandomState>,
    started: bool,
    packet: Message,
    scratch: Message,
    inner: Message,
}

impl<'a> PerfettoWriter<'a> {
    pub fn new(out: &'a mut (dyn Write + Send)) -> PerfettoWriter<'a> {
        PerfettoWriter {
            out: io::BufWriter::with_capacity(1 << 20, out),
            tracks: HashMap::default(),
            processes: HashMap::new(),
            names: HashMap::default(),
            started: false,
            packet: Message::default(),
            scratch: Message::default(),
            inner: Message::default(),
        }
    }

    /// Writes the packet built in `self.packet` as a `Trace.packet` field.
    fn flush_packet(&mut self) -> io::Result<()> {
        self.packet.write_as_field(TRACE_PACKET, &mut self.out)?;
        self.packet.clear();
        Ok(())
    }

    fn start_packet(&mut self) {
        self.packet.clear();
        self.packet.uint(packet::SEQUENCE_ID, SEQUENCE);
        if !self.started {
            self.packet
                .uint(packet::SEQUENCE_FLAGS, packet::INCREMENTAL_STATE_CLEARED);
            self.started = true;
        }
    }

    fn process_uuid(&mut self, rank: Option<i32>) -> io::Result<u64> {
        if let Some(u) = self.processes.get(&rank) {
            return Ok(*u);
        }
        let uuid = 1 + self.processes.len() as u64;
        self.processes.insert(rank, uuid);
        self.start_packet();
        let (scratch, inner) = (&mut self.scratch, &mut self.inner);
        self.packet.message(packet::TRACK_DESCRIPTOR, scratch, |d| {
            d.uint(1, uuid);
            d.message(3, inner, |p| {
                // A process id per rank: rank + 1 (0 is not a valid pid for the viewer).
                p.int(1, rank.map_or(0, |r| r as i64 + 1));
                p.string(6, &Track::process_name(rank));
            });
        });
        self.flush_packet()?;
        Ok(uuid)
    }

    fn track_uuid(&mut self, track: &Track) -> io::Result<u64> {
        if let Some(u) = self.tracks.get(track) {
            return Ok(*u);
        }
        let parent = self.process_uuid(track.rank())?;
        let uuid = 1_000_000 + self.tracks.len() as u64;
        self.tracks.insert(track.clone(), uuid);
        self.start_packet();
        let name = track.name();
        let counter = matches!(track, Track::Counter { .. });
        let (scratch, inner) = (&mut self.scratch, &mut self.inner);
        self.packet.message(packet::TRACK_DESCRIPTOR, scratch, |d| {
            d.uint(1, uuid);
            d.string(2, &name);
            d.uint(5, parent);
            if counter {
                d.message(8, inner, |_| {});
            }
        });
        self.flush_packet()?;
        Ok(uuid)
    }

    /// The interned id of `name`, and whether it is new (then the packet must carry it).
    fn name_iid(&mut self, name: &str) -> (u64, bool) {
        if let Some(iid) = self.names.get(name) {
            return (*iid, false);
        }
        let iid = 1 + self.names.len() as u64;
        self.names.insert(name.to_string(), iid);
        (iid, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        ts: i64,
        kind: u64,
        track: u64,
        name: Option<&str>,
        category: Option<&str>,
        flows: (Option<u64>, Option<u64>),
        args: &Args<'_>,
        value: Option<f64>,
    ) -> io::Result<()> {
        let named = name.map(|n| (self.name_iid(n), n));
        self.start_packet();
        self.packet.uint(packet::TIMESTAMP, ts.max(0) as u64);
        self.packet
            .uint(packet::SEQUENCE_FLAGS, packet::NEEDS_INCREMENTAL_STATE);
        if let Some(((iid, true), text)) = named {
            let (scratch, inner) = (&mut self.scratch, &mut self.inner);
            self.packet.message(packet::INTERNED_DATA, scratch, |d| {
                d.message(2, inner, |e| {
                    e.uint(1, iid);
                    e.string(2, text);
                });
            });
        }
        let (scratch, inner) = (&mut self.scratch, &mut self.inner);
        self.packet.message(packet::TRACK_EVENT, scratch, |e| {
            e.uint(event::TYPE, kind);
            e.uint(event::TRACK_UUID, track);
            if let Some(((iid, _), _)) = named {
                e.uint(event::NAME_IID, iid);
            }
            if let Some(c) = category {
                e.string(event::CATEGORIES, c);
            }
            for (key, arg) in args.iter() {
                e.message(event::DEBUG_ANNOTATIONS, inner, |a| {
                    a.string(10, key);
                    match arg {
                        Arg::Int(v) => a.int(4, v),
                        Arg::Text(t) => a.string(6, t),
                    }
                });
            }
            if let Some(f) = flows.0 {
                e.fixed64(event::FLOW_IDS, f);
            }
            if let Some(f) = flows.1 {
                e.fixed64(event::TERMINATING_FLOW_IDS, f);
            }
            if let Some(v) = value {
                e.double(event::DOUBLE_COUNTER_VALUE, v);
            }
        });
        self.flush_packet()
    }
}

impl Writer for PerfettoWriter<'_> {
    fn write(&mut self, items: &[Item<'_>]) -> io::Result<()> {
        // (track, time, end before begin, longer first, item): the order nesting needs.
        let mut order: Vec<(u64, i64, u8, i64, usize)> = Vec::with_capacity(items.len() * 2);
        for (i, item) in items.iter().enumerate() {
            match item {
                Item::Slice { track, ts, dur, .. } => {
                    let t = self.track_uuid(track)?;
                    order.push((t, *ts, 1, -dur, i));
                    order.push((t, ts + dur, 0, 0, i));
                }
                Item::Instant { track, ts, .. } | Item::Counter { track, ts, .. } => {
                    let t = self.track_uuid(track)?;
                    order.push((t, *ts, 1, 0, i));
                }
            }
        }
        order.sort_unstable();
        for (track, ts, phase, _, i) in order {
            match &items[i] {
                Item::Slice {
                    name,
                    category,
                    flow_out,
                    flow_in,
                    args,
                    ..
                } => {
                    if phase == 1 {
                        self.event(
                            ts,
                            event::SLICE_BEGIN,
                            track,
                            Some(name),
                            Some(category),
                            (*flow_out, *flow_in),
                            args,
                            None,
                        )?;
                    } else {
                        self.event(
                            ts,
                            event::SLICE_END,
                            track,
                            None,
                            None,
                            (None, None),
                            &Args::default(),
                            None,
                        )?;
                    }
                }
                Item::Instant { name, category, .. } => self.event(
                    ts,
                    event::INSTANT,
                    track,
                    Some(name),
                    Some(category),
                    (None, None),
                    &Args::default(),
                    None,
                )?,
                Item::Counter { value, .. } => self.event(
                    ts,
                    event::COUNTER,
                    track,
                    None,
                    None,
                    (None, None),
                    &Args::default(),
                    Some(*value),
                )?,
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn tracks(&self) -> u64 {
        self.tracks.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protobuf::fields;

    #[test]
    fn a_slice_is_a_begin_and_an_end_on_its_track_with_its_name_interned_once() {
        let mut out = Vec::new();
        {
            let mut w = PerfettoWriter::new(&mut out);
            let track = Track::Stream {
                rank: Some(0),
                device: 0,
                stream: Some(7),
            };
            let slice = |ts| Item::Slice {
                track: track.clone(),
                ts,
                dur: 10,
                name: "gemm",
                category: "kernel",
                flow_out: None,
                flow_in: Some(5),
                args: Args {
                    step: Some(3),
                    ..Args::default()
                },
            };
            w.write(&[
                slice(1_700_000_000_000_000_100),
                slice(1_700_000_000_000_000_000),
            ])
            .unwrap();
            w.finish().unwrap();
        }
        let packets: Vec<Vec<u8>> = fields(&out).into_iter().map(|f| f.3).collect();
        // Process descriptor, track descriptor, then begin/end, begin/end in time order.
        assert_eq!(packets.len(), 6);
        let times: Vec<u64> = packets[2..]
            .iter()
            .map(|p| fields(p).iter().find(|f| f.0 == 8).unwrap().2)
            .collect();
        assert_eq!(
            times,
            [
                1_700_000_000_000_000_000,
                1_700_000_000_000_000_010,
                1_700_000_000_000_000_100,
                1_700_000_000_000_000_110
            ]
        );
        let interned = packets
            .iter()
            .filter(|p| fields(p).iter().any(|f| f.0 == 12))
            .count();
        assert_eq!(interned, 1, "the name is sent once");
    }
}
