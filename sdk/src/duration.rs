//! Durations as people write them in a probe's config: `500ms`, `1.5s`,
//! `1m 30s`, `2 hours`, and back. The units and their spellings are
//! humantime's, which the agent's own config uses; they are parsed and
//! formatted here, in both modes, because humantime needs std.

use alloc::string::String;
use core::fmt::{self, Write as _};
use core::time::Duration;

/// Why a text is not a duration, in humantime's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DurationError {
    /// Nothing but whitespace.
    Empty,
    /// No number where one must be, at this byte offset.
    ExpectedNumber(usize),
    /// A number without a unit.
    UnitNeeded(String),
    /// A unit none of the spellings names.
    UnknownUnit(String),
    /// More than `u64` seconds, or a part below 1 ns.
    OutOfRange,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("value was empty"),
            Self::ExpectedNumber(at) => write!(f, "expected number at {at}"),
            Self::UnitNeeded(number) => write!(f, "time unit needed, for example {number}sec or {number}ms"),
            Self::UnknownUnit(unit) => write!(
                f,
                "unknown time unit {unit:?}, supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years"
            ),
            Self::OutOfRange => f.write_str("number is too large or below 1ns"),
        }
    }
}

impl core::error::Error for DurationError {}

/// Parses a sum of `NUMBER UNIT` terms, the number a whole or decimal
/// fraction, whitespace allowed between and within terms.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let mut rest = text.trim_start();
    if rest.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let at = text.len() - rest.len();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        if number.is_empty() || number.starts_with('.') || number.matches('.').count() > 1 {
            return Err(DurationError::ExpectedNumber(at));
        }
        let after = after.trim_start();
        let letters = after.find(|c: char| !c.is_alphabetic()).unwrap_or(after.len());
        let (unit, after) = after.split_at(letters);
        let Some(nanos) = unit_nanos(unit) else {
            return Err(if unit.is_empty() {
                DurationError::UnitNeeded(number.into())
            } else {
                DurationError::UnknownUnit(unit.into())
            });
        };
        total = total
            .checked_add(term(number, nanos).ok_or(DurationError::OutOfRange)?)
            .ok_or(DurationError::OutOfRange)?;
        rest = after.trim_start();
        if let Some(c) = rest.chars().next()
            && !c.is_ascii_digit()
        {
            return Err(DurationError::ExpectedNumber(text.len() - rest.len()));
        }
    }
    Ok(total)
}

/// `d` as humantime writes it: the non-zero parts from years (365.25
/// days) and months (30.44 days) down to nanoseconds, separated by spaces
/// (`1h 2m 3s`, `2days`, `1year 1month`); zero is `0s`.
pub fn format(d: Duration) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_to(&mut out, d);
    out
}

fn write_to(out: &mut String, d: Duration) -> fmt::Result {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    if secs == 0 && nanos == 0 {
        return out.write_str("0s");
    }
    let (years, rest) = (secs / 31_557_600, secs % 31_557_600);
    let (months, rest) = (rest / 2_630_016, rest % 2_630_016);
    let (days, rest) = (rest / 86_400, rest % 86_400);
    let parts: [(u64, &str, bool); 9] = [
        (years, "year", true),
        (months, "month", true),
        (days, "day", true),
        (rest / 3_600, "h", false),
        (rest % 3_600 / 60, "m", false),
        (rest % 60, "s", false),
        (u64::from(nanos / 1_000_000), "ms", false),
        (u64::from(nanos / 1_000 % 1_000), "us", false),
        (u64::from(nanos % 1_000), "ns", false),
    ];
    for (value, unit, plural) in parts {
        if value == 0 {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        write!(out, "{value}{unit}")?;
        if plural && value > 1 {
            out.push('s');
        }
    }
    Ok(())
}

/// `number` (digits, perhaps with one `.`) times `unit_nanos`, exactly.
fn term(number: &str, unit_nanos: u128) -> Option<Duration> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut nanos = whole.parse::<u128>().ok()?.checked_mul(unit_nanos)?;
    let mut scale = unit_nanos;
    for digit in fraction.bytes() {
        let part = u128::from(digit - b'0') * scale;
        scale /= 10;
        if !part.is_multiple_of(10) && scale == 0 {
            return None;
        }
        nanos = nanos.checked_add(part / 10)?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Nanoseconds in one `unit`: humantime's spellings, a month 30.44 days
/// and a year 365.25.
fn unit_nanos(unit: &str) -> Option<u128> {
    const S: u128 = 1_000_000_000;
    Some(match unit {
        "nanos" | "nsec" | "ns" => 1,
        "usec" | "us" | "µs" => 1_000,
        "millis" | "msec" | "ms" => 1_000_000,
        "seconds" | "second" | "secs" | "sec" | "s" => S,
        "minutes" | "minute" | "min" | "mins" | "m" => 60 * S,
        "hours" | "hour" | "hr" | "hrs" | "h" => 3_600 * S,
        "days" | "day" | "d" => 86_400 * S,
        "weeks" | "week" | "wk" | "wks" | "w" => 7 * 86_400 * S,
        "months" | "month" | "M" => 2_630_016 * S,
        "years" | "year" | "yr" | "yrs" | "y" => 31_557_600 * S,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn what_humantime_accepts() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("1s", Duration::from_secs(1)),
            ("1.5s", Duration::from_millis(1_500)),
            ("0.25 sec", Duration::from_millis(250)),
            ("1m 30s", Duration::from_secs(90)),
            ("1m30s", Duration::from_secs(90)),
            ("2 hours", Duration::from_secs(7_200)),
            ("1d", Duration::from_secs(86_400)),
            ("250us", Duration::from_micros(250)),
            ("7µs", Duration::from_micros(7)),
            ("3ns", Duration::from_nanos(3)),
            ("1.5ms", Duration::from_micros(1_500)),
            ("  2s ", Duration::from_secs(2)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
            assert_eq!(humantime::parse_duration(text).ok(), Some(want), "{text}");
        }
    }

    #[test]
    fn what_it_refuses_and_why() {
        for (text, why) in [
            ("", "value was empty"),
            ("   ", "value was empty"),
            ("500", "time unit needed, for example 500sec or 500ms"),
            ("5 parsecs", "unknown time unit \"parsecs\""),
            ("ms", "expected number at 0"),
            ("1s x", "expected number at 3"),
            ("1.2.3s", "expected number at 0"),
            ("-1s", "expected number at 0"),
            ("0.5ns", "too large or below 1ns"),
            ("99999999999999999999999999999999999999years", "too large"),
        ] {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(why), "{text}: {err}");
            assert!(humantime::parse_duration(text).is_err(), "humantime accepts {text:?}");
        }
    }

    #[test]
    fn formats_as_humantime_does() {
        let day = 86_400;
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(1_001_001),
            Duration::from_millis(1_500),
            Duration::from_secs(59),
            Duration::from_secs(90),
            Duration::from_secs(3_600),
            Duration::from_secs(3_661),
            Duration::from_secs(day),
            Duration::from_secs(2 * day + 1),
            Duration::from_secs(31 * day),
            Duration::from_secs(61 * day),
            Duration::from_secs(365 * day),
            Duration::from_secs(800 * day + 7_322),
            Duration::new(4 * 31_557_600 + 3, 999_999_999),
            Duration::MAX,
        ] {
            assert_eq!(format(d), humantime::format_duration(d).to_string(), "{d:?}");
        }
        // What a formatted duration reads back as.
        for text in ["5m", "1h 30m", "2days", "1year 2months 3days"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
