//! Go's time layouts (`"Jan _2 15:04:05"`,
//! `"2006-01-02T15:04:05.999999999-07:00"`): a filelog monitor's
//! `timestampFormat` says in Go's reference time where a line's time is.
//! What a monitor file meets is read; a layout element outside it (week
//! days are read and ignored) is refused at load.

use std::time::SystemTime;

/// One element of a layout.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Element {
    /// Text that must be there as written.
    Literal(String),
    /// `2006`, `06`.
    Year { digits: usize },
    /// `January`, `Jan`, `01`, `1`.
    Month(Width),
    /// `02`, `_2`, `2`.
    Day(Width),
    /// `Monday`, `Mon`: read, not used.
    Weekday { long: bool },
    /// `15` (24 hours), `03`, `3` (12 hours).
    Hour { twelve: bool, width: Width },
    /// `04`, `4`.
    Minute(Width),
    /// `05`, `5`.
    Second(Width),
    /// `.000` (that many digits), `.999` (up to that many), after a `.`
    /// or `,`.
    Fraction { digits: usize, optional: bool },
    /// `PM`, `pm`.
    Meridiem,
    /// `-07:00`, `-0700`, `-07`, and `Z07:00`... (a `Z` for UTC).
    Offset { colon: bool, minutes: bool, z: bool },
    /// `MST`: a zone's abbreviation, read and ignored (as Go does for
    /// one it does not know).
    Zone,
}

/// How a number is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    /// Two digits, zero-padded.
    Two,
    /// Two places, space-padded (`_2`).
    Space,
    /// One or two digits.
    Any,
    /// A month's name, long or short.
    Name { long: bool },
}

/// A Go time layout, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeLayout {
    text: String,
    elements: Vec<Element>,
}

/// Why a layout or a time is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// The layout names nothing sonde reads.
    #[error("{0:?}: no element of Go's reference time (Mon Jan 2 15:04:05 MST 2006) in it")]
    NoElement(String),
    /// The text does not have the layout's shape.
    #[error("{text:?} does not match the layout {layout:?}")]
    Mismatch {
        /// The time as found in the line.
        text: String,
        /// The layout.
        layout: String,
    },
    /// A field out of range (month 13).
    #[error("{text:?}: no such time")]
    Range {
        /// The time as found in the line.
        text: String,
    },
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The elements, longest first where one is the start of another.
/// (Fractions, any count of `0`s or `9`s, are matched apart.)
const TOKENS: [(&str, Element); 27] = [
    ("January", Element::Month(Width::Name { long: true })),
    ("Jan", Element::Month(Width::Name { long: false })),
    ("Monday", Element::Weekday { long: true }),
    ("Mon", Element::Weekday { long: false }),
    ("MST", Element::Zone),
    ("2006", Element::Year { digits: 4 }),
    (
        "-07:00",
        Element::Offset {
            colon: true,
            minutes: true,
            z: false,
        },
    ),
    (
        "-0700",
        Element::Offset {
            colon: false,
            minutes: true,
            z: false,
        },
    ),
    (
        "-07",
        Element::Offset {
            colon: false,
            minutes: false,
            z: false,
        },
    ),
    (
        "Z07:00",
        Element::Offset {
            colon: true,
            minutes: true,
            z: true,
        },
    ),
    (
        "Z0700",
        Element::Offset {
            colon: false,
            minutes: true,
            z: true,
        },
    ),
    (
        "Z07",
        Element::Offset {
            colon: false,
            minutes: false,
            z: true,
        },
    ),
    ("01", Element::Month(Width::Two)),
    ("02", Element::Day(Width::Two)),
    ("_2", Element::Day(Width::Space)),
    (
        "03",
        Element::Hour {
            twelve: true,
            width: Width::Two,
        },
    ),
    ("04", Element::Minute(Width::Two)),
    ("05", Element::Second(Width::Two)),
    ("06", Element::Year { digits: 2 }),
    (
        "15",
        Element::Hour {
            twelve: false,
            width: Width::Two,
        },
    ),
    ("PM", Element::Meridiem),
    ("pm", Element::Meridiem),
    ("1", Element::Month(Width::Any)),
    ("2", Element::Day(Width::Any)),
    (
        "3",
        Element::Hour {
            twelve: true,
            width: Width::Any,
        },
    ),
    ("4", Element::Minute(Width::Any)),
    ("5", Element::Second(Width::Any)),
];

impl TimeLayout {
    /// `text` read as a Go layout.
    pub fn new(text: &str) -> Result<Self, TimeError> {
        let mut elements = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        'next: while let Some(c) = rest.chars().next() {
            if let Some(n) = fraction(rest) {
                let optional = rest[1..].starts_with('9');
                push_literal(&mut elements, &mut literal);
                elements.push(Element::Fraction { digits: n, optional });
                rest = &rest[n + 1..];
                continue;
            }
            for (token, element) in &TOKENS {
                if rest.starts_with(token) {
                    push_literal(&mut elements, &mut literal);
                    elements.push(element.clone());
                    rest = &rest[token.len()..];
                    continue 'next;
                }
            }
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
        push_literal(&mut elements, &mut literal);
        if !elements.iter().any(|e| !matches!(e, Element::Literal(_))) {
            return Err(TimeError::NoElement(text.to_string()));
        }
        Ok(Self {
            text: text.to_string(),
            elements,
        })
    }

    /// The layout as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The time `text` says in this layout: in `text`'s offset when the
    /// layout has one, else in the local zone (Go's `time.Local`), in the
    /// current year when the layout has none (as NPD's filelog reads it).
    pub fn parse(&self, text: &str) -> Result<SystemTime, TimeError> {
        let mismatch = || TimeError::Mismatch {
            text: text.to_string(),
            layout: self.text.clone(),
        };
        let mut f = Fields::default();
        let mut rest = text;
        for (i, e) in self.elements.iter().enumerate() {
            rest = f.read(e, rest).ok_or_else(mismatch)?;
            // Go takes a fraction after the seconds the layout does not show.
            if matches!(e, Element::Second(_))
                && !matches!(self.elements.get(i + 1), Some(Element::Fraction { .. }))
                && rest
                    .strip_prefix(['.', ','])
                    .is_some_and(|after| after.starts_with(|c: char| c.is_ascii_digit()))
            {
                rest = f
                    .read(
                        &Element::Fraction {
                            digits: 9,
                            optional: true,
                        },
                        rest,
                    )
                    .ok_or_else(mismatch)?;
            }
        }
        if !rest.is_empty() {
            return Err(mismatch());
        }
        f.time().ok_or_else(|| TimeError::Range { text: text.to_string() })
    }
}

fn push_literal(elements: &mut Vec<Element>, literal: &mut String) {
    if !literal.is_empty() {
        elements.push(Element::Literal(std::mem::take(literal)));
    }
}

/// The count of `0`s or `9`s after a leading `.` or `,` of `rest`, when
/// that is a fraction element (not followed by another digit).
fn fraction(rest: &str) -> Option<usize> {
    let mut chars = rest.chars();
    if !matches!(chars.next(), Some('.' | ',')) {
        return None;
    }
    let digit = chars.next().filter(|c| matches!(c, '0' | '9'))?;
    let n = 1 + rest[2..].chars().take_while(|c| *c == digit).count();
    let after = rest[1 + n..].chars().next();
    (!after.is_some_and(|c| c.is_ascii_digit())).then_some(n)
}

/// What a text said, field by field.
#[derive(Default)]
struct Fields {
    year: Option<i16>,
    month: i8,
    day: i8,
    hour: i8,
    pm: Option<bool>,
    minute: i8,
    second: i8,
    nanos: i32,
    offset: Option<i32>,
}

impl Fields {
    /// Reads element `e` at the start of `text`: the rest.
    fn read<'a>(&mut self, e: &Element, text: &'a str) -> Option<&'a str> {
        match e {
            Element::Literal(l) => text.strip_prefix(l.as_str()),
            Element::Year { digits } => {
                let (n, rest) = digits_of(text, *digits, *digits)?;
                self.year = Some(if *digits == 2 {
                    1900 + n as i16 + if n < 69 { 100 } else { 0 }
                } else {
                    n as i16
                });
                Some(rest)
            }
            Element::Month(Width::Name { long }) => {
                let (i, rest) = name(text, &MONTHS, *long)?;
                self.month = i as i8 + 1;
                Some(rest)
            }
            Element::Weekday { long } => name(text, &DAYS, *long).map(|(_, rest)| rest),
            Element::Month(w) => number(text, *w).map(|(n, rest)| (self.month = n as i8, rest).1),
            Element::Day(w) => number(text, *w).map(|(n, rest)| (self.day = n as i8, rest).1),
            Element::Hour { twelve, width } => {
                let (n, rest) = number(text, *width)?;
                if *twelve && self.pm.is_none() {
                    self.pm = Some(false);
                }
                self.hour = n as i8;
                Some(rest)
            }
            Element::Minute(w) => number(text, *w).map(|(n, rest)| (self.minute = n as i8, rest).1),
            Element::Second(w) => number(text, *w).map(|(n, rest)| (self.second = n as i8, rest).1),
            Element::Fraction { digits, optional } => {
                let Some(after) = text.strip_prefix(['.', ',']) else {
                    return optional.then_some(text);
                };
                let (min, max) = if *optional { (1, 9) } else { (*digits, *digits) };
                let (n, rest) = digits_of(after, min, max)?;
                let len = after.len() - rest.len();
                self.nanos = (n * 10u32.pow(9 - len as u32)) as i32;
                Some(rest)
            }
            Element::Meridiem => {
                let (m, rest) = text.split_at_checked(2)?;
                self.pm = Some(match m {
                    "PM" | "pm" => true,
                    "AM" | "am" => false,
                    _ => return None,
                });
                Some(rest)
            }
            Element::Offset { colon, minutes, z } => {
                if *z && let Some(rest) = text.strip_prefix('Z') {
                    self.offset = Some(0);
                    return Some(rest);
                }
                let sign = match text.chars().next()? {
                    '+' => 1,
                    '-' => -1,
                    _ => return None,
                };
                let (h, mut rest) = digits_of(&text[1..], 2, 2)?;
                let mut m = 0;
                if *minutes {
                    if *colon {
                        rest = rest.strip_prefix(':')?;
                    }
                    (m, rest) = digits_of(rest, 2, 2)?;
                }
                self.offset = Some(sign * (h as i32 * 3600 + m as i32 * 60));
                Some(rest)
            }
            Element::Zone => {
                let n = text.chars().take_while(|c| c.is_ascii_uppercase()).count();
                (n >= 3).then(|| &text[n..])
            }
        }
    }

    /// The instant, if the fields name one.
    fn time(&self) -> Option<SystemTime> {
        let mut hour = self.hour;
        match self.pm {
            Some(true) if hour < 12 => hour += 12,
            Some(false) if hour == 12 => hour = 0,
            _ => {}
        }
        let year = match self.year {
            Some(y) => y,
            None => jiff::Zoned::now().year(),
        };
        let civil = jiff::civil::DateTime::new(
            year,
            self.month.max(1),
            self.day.max(1),
            hour,
            self.minute,
            self.second,
            self.nanos,
        )
        .ok()?;
        let zone = match self.offset {
            Some(s) => jiff::tz::TimeZone::fixed(jiff::tz::Offset::from_seconds(s).ok()?),
            None => jiff::tz::TimeZone::system(),
        };
        let at = civil.to_zoned(zone).ok()?.timestamp();
        Some(SystemTime::from(at))
    }
}

/// A number of `min` to `max` digits at the start of `text`, and the rest.
fn digits_of(text: &str, min: usize, max: usize) -> Option<(u32, &str)> {
    let n = text.bytes().take(max).take_while(u8::is_ascii_digit).count();
    (n >= min)
        .then(|| (text[..n].parse().ok(), &text[n..]))
        .and_then(|(v, r)| Some((v?, r)))
}

/// A number written as `width` says at the start of `text`.
fn number(text: &str, width: Width) -> Option<(u32, &str)> {
    match width {
        Width::Two => digits_of(text, 2, 2),
        Width::Space => digits_of(text.strip_prefix(' ').unwrap_or(text), 1, 2),
        _ => digits_of(text, 1, 2),
    }
}

/// Which of `names` (long, or their first three letters) starts `text`.
fn name<'a>(text: &'a str, names: &[&str], long: bool) -> Option<(usize, &'a str)> {
    names.iter().enumerate().find_map(|(i, n)| {
        let n = if long { *n } else { &n[..3] };
        let head = text.get(..n.len())?;
        head.eq_ignore_ascii_case(n).then(|| (i, &text[n.len()..]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(layout: &str, text: &str) -> Result<SystemTime, TimeError> {
        TimeLayout::new(layout).unwrap().parse(text)
    }

    #[test]
    fn npd_shipped_layouts_read_their_lines() {
        let s = |secs: u64, nanos: u32| UNIX_EPOCH + Duration::new(secs, nanos);
        assert_eq!(
            at(
                "2006-01-02T15:04:05.999999999-07:00",
                "2026-11-29T02:30:00.123456789+01:00"
            ),
            Ok(s(1_795_915_800, 123_456_789))
        );
        assert_eq!(
            at("2006-01-02T15:04:05.999999999-07:00", "2026-11-29T01:30:00Z"),
            Err(TimeError::Mismatch {
                text: "2026-11-29T01:30:00Z".into(),
                layout: "2006-01-02T15:04:05.999999999-07:00".into()
            }),
            "-07:00 takes no Z, as in Go"
        );
        assert_eq!(
            at("2006-01-02T15:04:05.999999999Z07:00", "2026-11-29T01:30:00Z"),
            Ok(s(1_795_915_800, 0))
        );
        assert_eq!(
            at("2006-01-02T15:04:05Z07:00", "2026-11-29T01:30:00.5Z"),
            Ok(s(1_795_915_800, 500_000_000))
        );
        // Without a year: this year, in the local zone.
        let t = at("Jan _2 15:04:05", "Nov  9 08:07:06").unwrap();
        let z = jiff::Timestamp::try_from(t)
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::system());
        assert_eq!((z.month(), z.day(), z.hour(), z.minute(), z.second()), (11, 9, 8, 7, 6));
        assert_eq!(z.year(), jiff::Zoned::now().year());
        assert!(at("Jan _2 15:04:05", "Nov 29 08:07").is_err());
        assert!(at("Jan _2 15:04:05", "Foo 29 08:07:06").is_err());
        assert_eq!(
            at("01/02/2006 03:04 PM", "11/29/2026 01:30 AM"),
            at("2006-01-02 15:04 MST", "2026-11-29 01:30 UTC")
                .map(|_| at("01/02/2006 15:04", "11/29/2026 01:30").unwrap())
        );
    }

    #[test]
    fn a_layout_without_an_element_is_refused() {
        assert_eq!(
            TimeLayout::new("yyyy-mm-dd"),
            Err(TimeError::NoElement("yyyy-mm-dd".into()))
        );
        assert!(TimeLayout::new("").is_err());
    }
}
