//! A record as the validators read it: one line of text, as blackbox's
//! miekg/dns writes it (see the crate's documentation).

use alloc::format;
use alloc::string::{String, ToString};
use hickory_proto::rr::{RData, Record};

/// A record as the validators read it (see the crate's documentation).
pub(crate) fn text(r: &Record) -> String {
    let data = match r.data() {
        RData::TXT(txt) => quoted(txt.txt_data()),
        other => other.to_string(),
    };
    format!(
        "{}\t{}\t{}\t{}\t{data}",
        r.name(),
        r.ttl(),
        r.dns_class(),
        r.record_type(),
    )
}

/// TXT strings as miekg/dns writes them: each in double quotes, separated
/// by a space; `"` and `\` escaped with a backslash, and a byte outside
/// printable ASCII as `\DDD` (three decimal digits).
fn quoted(strings: &[alloc::boxed::Box<[u8]>]) -> String {
    let mut out = String::new();
    for (i, s) in strings.iter().enumerate() {
        out.push_str(if i == 0 { "\"" } else { " \"" });
        for &b in s.iter() {
            match b {
                b'"' | b'\\' => {
                    out.push('\\');
                    out.push(char::from(b));
                }
                b' '..=b'~' => out.push(char::from(b)),
                _ => out.push_str(&format!("\\{b:03}")),
            }
        }
        out.push('"');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn txt_strings_are_quoted_as_miekg_quotes_them() {
        let strings: Vec<alloc::boxed::Box<[u8]>> = vec![
            b"v=spf1 -all".to_vec().into(),
            b"say \"hi\" \\ \x01\xc3\xa9".to_vec().into(),
        ];
        assert_eq!(
            quoted(&strings),
            "\"v=spf1 -all\" \"say \\\"hi\\\" \\\\ \\001\\195\\169\""
        );
        assert_eq!(quoted(&[]), "");
    }
}
