//! The time zone that naive stage-log times (written without a UTC offset) are read in, as
//! given by `gpuq ingest --tz`: an IANA name (`Europe/Berlin`, with its daylight-saving rules,
//! from the tz database that chrono-tz compiles in) or a fixed offset (`+01:00`, `-0530`,
//! `Z`). A local time that the zone's clocks skipped or passed twice (a daylight-saving change)
//! has no single UTC instant: it is an error, never a guess.

use chrono::{NaiveDate, Offset, TimeZone};
use nom::combinator::eof;
use nom::Parser;
use std::fmt;
use std::str::FromStr;

/// Where naive local times are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogZone {
    /// Seconds east of UTC.
    Fixed(i64),
    Named(chrono_tz::Tz),
}

impl LogZone {
    pub const UTC: LogZone = LogZone::Fixed(0);

    /// Seconds east of UTC in force at the local date-time `(year, month, day)`
    /// `(hour, minute, second)` (already range-checked), or why there is no single one.
    pub fn offset_at(&self, date: (i64, u32, u32), time: (u32, u32, u32)) -> Result<i64, String> {
        let tz = match self {
            LogZone::Fixed(s) => return Ok(*s),
            LogZone::Named(tz) => tz,
        };
        let local = i32::try_from(date.0)
            .ok()
            .and_then(|y| NaiveDate::from_ymd_opt(y, date.1, date.2))
            .and_then(|d| d.and_hms_opt(time.0, time.1, time.2))
            .ok_or_else(|| format!("no such local date-time in {tz}"))?;
        match tz.offset_from_local_datetime(&local) {
            chrono::LocalResult::Single(o) => Ok(i64::from(o.fix().local_minus_utc())),
            chrono::LocalResult::Ambiguous(a, b) => Err(format!(
                "{local} happened twice in {tz} (the clocks went back, at {} and at {}): \
                 write this time with its UTC offset",
                offset_text(i64::from(a.fix().local_minus_utc())),
                offset_text(i64::from(b.fix().local_minus_utc())),
            )),
            chrono::LocalResult::None => Err(format!(
                "{local} did not happen in {tz} (the clocks went forward): write this time \
                 with its UTC offset"
            )),
        }
    }
}

/// `+HH:MM` of seconds east of UTC.
fn offset_text(secs: i64) -> String {
    let sign = if secs < 0 { '-' } else { '+' };
    let m = secs.abs() / 60;
    format!("{sign}{:02}:{:02}", m / 60, m % 60)
}

impl FromStr for LogZone {
    type Err = String;

    /// `Z`, `±HH`, `±HH:MM`, `±HHMM` (the offsets an ISO-8601 time may carry), or an IANA
    /// zone name (`UTC`, `Europe/Berlin`, `America/New_York`).
    fn from_str(text: &str) -> Result<LogZone, String> {
        if let Ok((_, ((sign, h, m), _))) = (super::offset, eof).parse(text) {
            if h > 23 || m > 59 {
                return Err(format!("UTC offset {text:?} out of range"));
            }
            return Ok(LogZone::Fixed(
                sign * (i64::from(h) * 3600 + i64::from(m) * 60),
            ));
        }
        text.parse::<chrono_tz::Tz>()
            .map(LogZone::Named)
            .map_err(|_| {
                format!(
                    "{text:?} is neither a UTC offset (+01:00, -0530, Z) nor an IANA time zone \
                 name (Europe/Berlin, America/New_York, UTC)"
                )
            })
    }
}

impl fmt::Display for LogZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogZone::Fixed(s) => f.write_str(&offset_text(*s)),
            LogZone::Named(tz) => write!(f, "{tz}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_parse_as_offsets_or_iana_names() {
        assert_eq!("+01:00".parse(), Ok(LogZone::Fixed(3600)));
        assert_eq!("-0530".parse(), Ok(LogZone::Fixed(-19_800)));
        assert_eq!("+02".parse(), Ok(LogZone::Fixed(7200)));
        assert_eq!("Z".parse(), Ok(LogZone::UTC));
        assert_eq!(
            "Europe/Berlin".parse(),
            Ok(LogZone::Named(chrono_tz::Europe::Berlin))
        );
        for bad in ["+24:00", "Mars/Olympus", "", "+1", "01:00"] {
            assert!(bad.parse::<LogZone>().is_err(), "{bad}");
        }
        assert_eq!(LogZone::Fixed(-19_800).to_string(), "-05:30");
    }

    #[test]
    fn named_zones_follow_daylight_saving_time() {
        let berlin: LogZone = "Europe/Berlin".parse().unwrap();
        assert_eq!(berlin.offset_at((2026, 12, 2), (10, 0, 0)), Ok(3600));
        assert_eq!(berlin.offset_at((2026, 7, 2), (10, 0, 0)), Ok(7200));
        // 2026-03-29 02:30 was skipped, 2026-10-25 02:30 happened twice.
        let e = berlin.offset_at((2026, 3, 29), (2, 30, 0)).unwrap_err();
        assert!(e.contains("did not happen"), "{e}");
        let e = berlin.offset_at((2026, 10, 25), (2, 30, 0)).unwrap_err();
        assert!(e.contains("happened twice") && e.contains("+02:00"), "{e}");
        assert_eq!(
            LogZone::Fixed(-3600).offset_at((2026, 3, 29), (2, 30, 0)),
            Ok(-3600)
        );
    }
}
