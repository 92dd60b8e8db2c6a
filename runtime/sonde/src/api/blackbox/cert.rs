//! A served certificate's facts as blackbox_exporter's labels carry them:
//! its expiry, names as Go's `pkix.Name.String()` writes them, its DNS
//! names and its serial number.

/// The facts of a served certificate the series use.
pub(super) struct Cert {
    pub(super) not_after: i64,
    pub(super) subject: String,
    pub(super) issuer: String,
    /// The raw subject and issuer, to follow the chain.
    pub(super) subject_raw: Vec<u8>,
    pub(super) issuer_raw: Vec<u8>,
    pub(super) dns_names: Vec<String>,
    /// The serial number as blackbox (0.26 on) writes it: the bytes of its
    /// magnitude in lowercase hex, without leading zero bytes.
    pub(super) serial: String,
}

/// The facts of the certificate `der`, or `None` when it does not parse.
pub(super) fn parse(der: &[u8]) -> Option<Cert> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let dns_names = match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some(Cert {
        not_after: cert.validity().not_after.timestamp(),
        subject: dn(cert.subject()),
        issuer: dn(cert.issuer()),
        subject_raw: cert.subject().as_raw().to_vec(),
        issuer_raw: cert.issuer().as_raw().to_vec(),
        dns_names,
        serial: serial_hex(cert.raw_serial()),
    })
}

/// The content octets of a serial's DER INTEGER as Go's `%x` of
/// `SerialNumber.Bytes()` writes them: lowercase hex, leading zero bytes
/// dropped (DER puts one before a first byte of 128 or more). Go refuses
/// negative serials, which are not taken care of here.
fn serial_hex(raw: &[u8]) -> String {
    let start = raw.iter().position(|&b| b != 0).unwrap_or(raw.len());
    raw[start..].iter().map(|b| format!("{b:02x}")).collect()
}

/// A distinguished name as Go's `pkix.Name.String()` writes it, which
/// blackbox's labels carry: the well-known attributes from the most
/// specific (`CN`) to the least (`C`), comma-separated, then the others
/// (`UID`, `emailAddress`...: Go has no short name for them) as
/// `OID=#DER-in-hex`, last in the certificate first. (Go puts them before
/// the named ones in a sequence it writes from its end.)
fn dn(name: &x509_parser::x509::X509Name<'_>) -> String {
    let attrs: Vec<(String, String)> = name
        .iter_attributes()
        .map(|a| {
            (
                a.attr_type().to_id_string(),
                a.as_str().map(str::to_string).unwrap_or_default(),
            )
        })
        .collect();
    go_order(&attrs)
}

/// [`dn`] of the attributes `attrs` (OID in dotted text, value), in the
/// certificate's order.
fn go_order(attrs: &[(String, String)]) -> String {
    // Go's order, most specific first, and each attribute's short name.
    const KNOWN: [(&str, &str); 9] = [
        ("2.5.4.5", "SERIALNUMBER"),
        ("2.5.4.3", "CN"),
        ("2.5.4.11", "OU"),
        ("2.5.4.10", "O"),
        ("2.5.4.17", "POSTALCODE"),
        ("2.5.4.9", "STREET"),
        ("2.5.4.7", "L"),
        ("2.5.4.8", "ST"),
        ("2.5.4.6", "C"),
    ];
    let mut parts = Vec::new();
    for (oid, short) in KNOWN {
        let values: Vec<String> = attrs
            .iter()
            .filter(|(o, _)| o == oid)
            .map(|(_, v)| format!("{short}={}", dn_escape(v)))
            .collect();
        if !values.is_empty() {
            parts.push(values.join("+"));
        }
    }
    for (oid, v) in attrs.iter().rev() {
        if !KNOWN.iter().any(|(k, _)| k == oid) {
            parts.push(format!("{oid}=#{}", der_string_hex(v)));
        }
    }
    parts.join(",")
}

/// An attribute of no short name, as Go writes it: the DER of the value
/// re-encoded as Go's `asn1.Marshal` encodes a string (a PrintableString
/// when every character allows it, else a UTF8String), in hex.
fn der_string_hex(v: &str) -> String {
    let printable = v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b));
    let mut der = vec![if printable { 0x13 } else { 0x0c }];
    let len = v.len();
    if len < 0x80 {
        der.push(len as u8);
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        der.push(0x80 | bytes.len() as u8);
        der.extend(bytes);
    }
    der.extend(v.as_bytes());
    der.iter().map(|b| format!("{b:02x}")).collect()
}

/// Escapes an attribute value as RFC 2253 (and Go) do.
fn dn_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == ' ' || c == '#'))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attribute_without_a_short_name_is_its_der_in_hex() {
        assert_eq!(der_string_hex("ops@sonde.test"), "0c0e6f707340736f6e64652e74657374");
        assert_eq!(der_string_hex("AB"), "13024142");
    }

    #[test]
    fn attributes_without_a_short_name_come_last_in_reverse() {
        let attr = |oid: &str, v: &str| (oid.to_string(), v.to_string());
        let attrs = [
            attr("2.5.4.6", "ZZ"),
            attr("1.2.840.113549.1.9.1", "ops@sonde.test"),
            attr("2.5.4.3", "localhost"),
            attr("0.9.2342.19200300.100.1.1", "AB"),
        ];
        assert_eq!(
            go_order(&attrs),
            "CN=localhost,C=ZZ,0.9.2342.19200300.100.1.1=#13024142,\
             1.2.840.113549.1.9.1=#0c0e6f707340736f6e64652e74657374"
        );
    }

    #[test]
    fn dn_values_are_escaped() {
        assert_eq!(dn_escape("a,b"), "a\\,b");
        assert_eq!(dn_escape(" x "), "\\ x\\ ");
        assert_eq!(dn_escape("plain"), "plain");
    }

    #[test]
    fn a_serial_is_its_magnitude_in_lowercase_hex() {
        assert_eq!(serial_hex(&[0x00, 0x8f, 0x0a]), "8f0a");
        assert_eq!(serial_hex(&[0x7f, 0x00]), "7f00");
        assert_eq!(serial_hex(&[0x00]), "");
    }
}
