//! Putting a stage log on the clock of the run it is added to, or refusing it.
//!
//! Stage-log times are epoch ns. A run whose `ts` are epoch ns too (Kineto) takes the log as
//! is; a run on a trace-relative clock (Nsight Systems' session timebase) takes it shifted by
//! the session's UTC start that its metadata holds (`nsys.session_start_utc_ns`: session `ts`
//! = epoch ns − session start). Either way the log's span must then overlap the run's span
//! (`first_ts`..`last_ts`): a log from another day, or on a clock the run cannot convert, is
//! an error that shows both spans, never silently mixed clocks. A stage log that is a run of
//! its own has nothing to check against.

use gpuq_engine::RunMeta;

/// What a stage log is checked against: the span and clock of the run's traces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunClock {
    pub first_ts: i64,
    pub last_ts: i64,
    /// `ts` are epoch ns (else relative to the trace's start).
    pub epoch: bool,
    /// The UTC start of an Nsight Systems session (epoch ns), which converts epoch times to
    /// its session clock.
    pub session_start_utc_ns: Option<i64>,
}

impl RunClock {
    /// The clock of a run's traces; `None` when the run has no timed event.
    pub fn of(meta: &RunMeta) -> Option<RunClock> {
        Some(RunClock {
            first_ts: meta.first_ts?,
            last_ts: meta.last_ts?,
            epoch: meta.epoch_time,
            session_start_utc_ns: meta
                .metadata
                .pointer("/nsys/session_start_utc_ns")
                .and_then(|v| v.as_i64()),
        })
    }

    /// The shift (ns) that puts a log spanning `first..=last` (epoch ns) on this clock, or why
    /// it cannot be.
    pub fn place(&self, first: i64, last: i64) -> Result<i64, String> {
        let shift = if self.epoch {
            0
        } else {
            match self.session_start_utc_ns {
                Some(start) => -start,
                None => {
                    return Err(format!(
                        "the run's times are relative to its trace's start and its metadata \
                         holds no UTC session start, so a stage log on the epoch clock ({} to {}) \
                         cannot be placed on it; ingest the log as a run of its own",
                        utc(first),
                        utc(last)
                    ))
                }
            }
        };
        let (a, b) = (first.saturating_add(shift), last.saturating_add(shift));
        if a <= self.last_ts && b >= self.first_ts {
            return Ok(shift);
        }
        let run_span = if self.epoch {
            format!("{} to {}", utc(self.first_ts), utc(self.last_ts))
        } else {
            let start = self.session_start_utc_ns.unwrap_or(0);
            format!(
                "{} to {} (session clock + session start {})",
                utc(self.first_ts + start),
                utc(self.last_ts + start),
                utc(start)
            )
        };
        Err(format!(
            "the stage log's times ({} to {}) do not overlap the run's ({run_span}): it belongs \
             to another run or another clock; fix its timestamps or ingest it as a run of its own",
            utc(first),
            utc(last)
        ))
    }
}

/// Epoch ns as `YYYY-MM-DDTHH:MM:SS.fffffffffZ`.
pub fn utc(ns: i64) -> String {
    let (secs, frac) = (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(epoch: bool, start: Option<i64>) -> RunClock {
        RunClock {
            first_ts: 1_000,
            last_ts: 2_000,
            epoch,
            session_start_utc_ns: start,
        }
    }

    #[test]
    fn logs_that_overlap_are_placed_and_others_refused() {
        assert_eq!(clock(true, None).place(500, 1_500), Ok(0));
        assert_eq!(clock(true, None).place(0, 10_000), Ok(0));
        let err = clock(true, None).place(3_000, 4_000).unwrap_err();
        assert!(err.contains("do not overlap"), "{err}");
        // Session clock: converted with the session start.
        let start = 1_767_225_600_000_000_000;
        assert_eq!(
            clock(false, Some(start)).place(start + 1_200, start + 1_300),
            Ok(-start)
        );
        let err = clock(false, Some(start)).place(1_200, 1_300).unwrap_err();
        assert!(
            err.contains("session start 2026-01-01T00:00:00.000000000Z"),
            "{err}"
        );
        let err = clock(false, None).place(1_200, 1_300).unwrap_err();
        assert!(err.contains("no UTC session start"), "{err}");
    }

    #[test]
    fn utc_formats_epoch_nanoseconds() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            utc(1_767_225_600_000_000_001),
            "2026-01-01T00:00:00.000000001Z"
        );
        assert_eq!(
            utc(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000000Z"
        );
    }
}
