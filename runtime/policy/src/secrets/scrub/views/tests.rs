//! The decoders, one at a time.

use super::*;

fn text(v: Cow<'_, [u8]>) -> String {
    String::from_utf8_lossy(&v).into_owned()
}

#[test]
fn escapes_are_decoded_the_way_servers_write_them() {
    assert_eq!(
        text(unescape(br#"a\"b\\c\/d\u00e9\u0026\x41\u{1F600}\ud83d\ude00"#)),
        "a\"b\\c/dé&A😀😀"
    );
    assert_eq!(
        text(unescape(b"&amp;&lt;&gt;&quot;&apos;&#39;&#x41;&#65;")),
        "&<>\"''AA"
    );
    assert_eq!(text(unescape(b"a%2fb%2Fc+d%zz")), "a/b/c+d%zz");
    // Layered: JSON of HTML of percent.
    assert_eq!(text(unescape(br"\u0026#x25;41")), "A");
    // Malformed escapes stay as they are.
    assert_eq!(text(unescape(br"\q &nope; \u12 \x4")), r"\q &nope; \u12 \x4");
    assert!(matches!(unescape(b"plain text"), Cow::Borrowed(_)));
}

#[test]
fn an_escape_a_read_cut_short_is_not_read_until_it_ends() {
    let open = Reading {
        code_points: CodePoints::Utf8,
        open: true,
    };
    type Decode = fn(&[u8], Reading) -> Option<Decoded>;
    let decoders: [(&str, Decode); 3] = [
        ("strings", string_escapes),
        ("html", html_references),
        ("percent", percent),
    ];
    // May still become an escape: the view stops before it.
    for (decoder, cut) in [
        (0, r"\"),
        (0, r"\x4"),
        (0, r"\u00"),
        (0, r"\u{1F6"),
        (0, r"\ud83d"),
        (0, r"\ud83d\ude0"),
        (1, "&"),
        (1, "&#x4"),
        (1, "&#12"),
        (1, "&am"),
        (2, "%"),
        (2, "%4"),
    ] {
        let (name, decode) = decoders[decoder];
        let text = format!("ab{cut}");
        let view = decode(text.as_bytes(), open).expect(name);
        assert_eq!(view.bytes, b"ab", "{name} {cut}");
    }
    // Can never be one: read as it is.
    for (decoder, whole) in [
        (0, r"\q"),
        (0, r"\u12x"),
        (1, "&nope"),
        (1, "&#x4g"),
        (2, "%zz"),
        (2, "%4g"),
    ] {
        let (name, decode) = decoders[decoder];
        let text = format!("ab{whole}");
        assert_eq!(
            decode(text.as_bytes(), open).expect(name).bytes,
            text.as_bytes(),
            "{name} {whole}"
        );
    }
}

/// Records every view it is shown, and finds nothing.
#[derive(Default)]
struct Recorder(std::cell::RefCell<Vec<Vec<u8>>>);

impl Target for Recorder {
    fn found_in(&self, view: &[u8]) -> bool {
        self.0.borrow_mut().push(view.to_vec());
        false
    }
    fn lengths(&self) -> impl Iterator<Item = usize> + '_ {
        [8].into_iter()
    }
    fn shortest(&self) -> usize {
        8
    }
}

#[test]
fn base64_and_hex_runs_are_decoded_at_every_alignment() {
    // "hello world!" in base64 after a prefix that shifts it.
    let seen = Recorder::default();
    any(b"xx:QaGVsbG8gd29ybGQh==", false, &seen);
    let seen = seen.0.into_inner();
    assert!(seen.iter().any(|v| v.windows(8).any(|w| w == b"hello wo")), "{seen:?}");
    let seen = Recorder::default();
    any(b"x68656C6C6f20776f726c64", false, &seen);
    let seen = seen.0.into_inner();
    assert!(seen.iter().any(|v| v.starts_with(b"hello wo")), "{seen:?}");
}
