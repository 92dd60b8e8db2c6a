//! Durations and sizes as the file writes them (`500ms`, `16KiB`).

use super::*;

/// A duration written with its unit: `500ms`, `10s`, `1m30s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration with its unit, such as 500ms, 10s or 1m")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                humantime::parse_duration(s.trim())
                    .map(Dur)
                    .map_err(|e| E::custom(format!("{s:?} is not a duration such as 500ms, 10s or 1m: {e}")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Dur, E> {
                Err(E::custom(format!("{n} has no unit: write it as {n}s or {n}ms")))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Dur, E> {
                self.visit_u64(n.unsigned_abs())
            }
        }
        d.deserialize_any(V)
    }
}

/// A size written with its unit: `64MiB`, `512KiB`, `4096B`. A bare
/// number (`1048576`, `"1048576"`) is refused, as a duration without its
/// unit is: bytes or mebibytes is the reader's guess otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Size(pub u64);

impl Size {
    /// The refusal of a bare number `n`, suggesting the spellings that
    /// say what it means.
    fn no_unit(n: u64) -> String {
        let mut hint = format!("{n}B");
        if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
            hint = format!("{}MiB (or {hint})", n >> 20);
        } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
            hint = format!("{}KiB (or {hint})", n >> 10);
        }
        format!("{n} has no unit: write the size with one, such as {hint}")
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size with its unit, such as 64MiB")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                let t = s.trim();
                if let Ok(n) = t.parse::<u64>() {
                    return Err(E::custom(Size::no_unit(n)));
                }
                t.parse::<bytesize::ByteSize>()
                    .map(|b| Size(b.as_u64()))
                    .map_err(|e| E::custom(format!("{s:?} is not a size such as 64MiB: {e}")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                Err(E::custom(Size::no_unit(n)))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "{n} is not a size: write one with its unit, such as 64MiB"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}
