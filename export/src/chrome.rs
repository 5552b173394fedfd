//! Chrome's JSON trace format (chrome://tracing, TensorBoard, Perfetto's JSON import).
//! Its times are microseconds that viewers read through a double, which cannot hold an epoch
//! time to the nanosecond: times are written relative to the window's start, as microseconds
//! with three decimals (exact for spans of days). Complete events (`X`) carry their
//! duration; launch-to-GPU flows are `s`/`f` pairs; counters are `C` events.

#[cfg(test)]
use crate::Args;
use crate::{Arg, Item, Track, Writer};
use std::collections::HashMap;
use std::io::{self, Write};

pub struct ChromeWriter<'a> {
    out: io::BufWriter<&'a mut (dyn Write + Send)>,
    base: i64,
    /// Thread ids given to tracks, per track.
    tracks: HashMap<Track, u64, ahash::RandomState>,
    processes: HashMap<Option<i32>, ()>,
    first: bool,
}

impl<'a> ChromeWriter<'a> {
    /// `base`: the time (ns) written as 0.
    pub fn new(out: &'a mut (dyn Write + Send), base: i64) -> ChromeWriter<'a> {
        ChromeWriter {
            out: io::BufWriter::with_capacity(1 << 20, out),
            base,
            tracks: HashMap::default(),
            processes: HashMap::new(),
            first: true,
        }
    }

    fn pid(rank: Option<i32>) -> i64 {
        rank.map_or(0, |r| r as i64 + 1)
    }

    fn event(&mut self, json: &str) -> io::Result<()> {
        if self.first {
            self.out
                .write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
            self.first = false;
        } else {
            self.out.write_all(b",\n")?;
        }
        self.out.write_all(json.as_bytes())
    }

    /// µs with three decimals, relative to the base.
    fn us(&self, ts: i64) -> String {
        let d = ts - self.base;
        let sign = if d < 0 { "-" } else { "" };
        let a = d.unsigned_abs();
        format!("{sign}{}.{:03}", a / 1000, a % 1000)
    }

    fn tid(&mut self, track: &Track) -> io::Result<u64> {
        if let Some(t) = self.tracks.get(track) {
            return Ok(*t);
        }
        let rank = track.rank();
        let pid = Self::pid(rank);
        if self.processes.insert(rank, ()).is_none() {
            let name = json(&Track::process_name(rank));
            self.event(&format!(
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"args\":{{\"name\":{name}}}}}"
            ))?;
        }
        let tid = 1 + self.tracks.len() as u64;
        self.tracks.insert(track.clone(), tid);
        let name = json(&track.name());
        self.event(&format!(
            "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{name}}}}}"
        ))?;
        Ok(tid)
    }
}

fn json(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl Writer for ChromeWriter<'_> {
    fn write(&mut self, items: &[Item<'_>]) -> io::Result<()> {
        for item in items {
            match item {
                Item::Slice {
                    track,
                    ts,
                    dur,
                    name,
                    category,
                    flow_out,
                    flow_in,
                    args,
                } => {
                    let tid = self.tid(track)?;
                    let pid = Self::pid(track.rank());
                    let mut a = String::new();
                    for (k, v) in args.iter() {
                        if !a.is_empty() {
                            a.push(',');
                        }
                        match v {
                            Arg::Int(n) => a.push_str(&format!("\"{k}\":{n}")),
                            Arg::Text(t) => a.push_str(&format!("\"{k}\":{}", json(t))),
                        }
                    }
                    let (t, d) = (self.us(*ts), self.us(self.base + dur));
                    self.event(&format!(
                        "{{\"ph\":\"X\",\"name\":{},\"cat\":\"{category}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{t},\"dur\":{d},\"args\":{{{a}}}}}",
                        json(name)
                    ))?;
                    if let Some(id) = flow_out {
                        self.event(&format!(
                            "{{\"ph\":\"s\",\"name\":\"launch\",\"cat\":\"launch\",\"id\":{id},\"pid\":{pid},\"tid\":{tid},\"ts\":{t}}}"
                        ))?;
                    }
                    if let Some(id) = flow_in {
                        self.event(&format!(
                            "{{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"launch\",\"cat\":\"launch\",\"id\":{id},\"pid\":{pid},\"tid\":{tid},\"ts\":{t}}}"
                        ))?;
                    }
                }
                Item::Instant {
                    track,
                    ts,
                    name,
                    category,
                } => {
                    let tid = self.tid(track)?;
                    let pid = Self::pid(track.rank());
                    let t = self.us(*ts);
                    self.event(&format!(
                        "{{\"ph\":\"i\",\"s\":\"t\",\"name\":{},\"cat\":\"{category}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{t}}}",
                        json(name)
                    ))?;
                }
                Item::Counter { track, ts, value } => {
                    self.tid(track)?;
                    let pid = Self::pid(track.rank());
                    let t = self.us(*ts);
                    let v = if value.is_finite() { *value } else { 0.0 };
                    self.event(&format!(
                        "{{\"ph\":\"C\",\"name\":{},\"pid\":{pid},\"ts\":{t},\"args\":{{\"value\":{v}}}}}",
                        json(&track.name())
                    ))?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        if self.first {
            self.out
                .write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        }
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()
    }

    fn tracks(&self) -> u64 {
        self.tracks.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_exact_microseconds_from_the_base_and_the_file_is_json() {
        let mut out = Vec::new();
        {
            let mut w = ChromeWriter::new(&mut out, 1_700_000_000_000_000_000);
            w.write(&[Item::Slice {
                track: Track::Thread {
                    rank: Some(1),
                    pid: Some(9),
                    tid: Some(10),
                },
                ts: 1_700_000_000_000_001_234,
                dur: 5,
                name: "cudaLaunchKernel \"x\"",
                category: "runtime",
                flow_out: Some(77),
                flow_in: None,
                args: Args {
                    correlation: Some(3),
                    ..Args::default()
                },
            }])
            .unwrap();
            w.finish().unwrap();
        }
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let x = events.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!(x["ts"].to_string(), "1.234");
        assert_eq!(x["dur"].to_string(), "0.005");
        assert_eq!(x["pid"], 2);
        assert_eq!(x["args"]["correlation"], 3);
        assert!(events.iter().any(|e| e["ph"] == "s" && e["id"] == 77));
    }
}
