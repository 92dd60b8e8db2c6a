use super::*;

fn matches(pattern: &str, text: &str) -> bool {
    compile(pattern)
        .unwrap_or_else(|e| panic!("{pattern:?}: {e}"))
        .is_match(text)
}

#[test]
fn what_blackbox_users_write_compiles() {
    for p in [
        "(?i)ok",
        "(?s)a.b",
        "(?m)^up$",
        "(?P<v>\\d+)",
        "(?<v>\\d+)",
        "\\p{Greek}+",
        "\\pL",
        "\\p{^Greek}",
        "\\P{^Greek}",
        "[[:alpha:]]+",
        "[[:^digit:]]",
        "\\x{263a}",
        "\\Q1.5*\\E",
        "{\"status\": ?\"UP\"}",
        "a{2,}",
        "\\012",
    ] {
        compile(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    }
}

#[test]
fn case_folding_is_unicode() {
    assert!(matches("(?i)straße", "STRAßE"));
    assert!(matches("(?i)ÉTÉ", "été"));
    assert!(matches("(?i)^ok$", "OK"));
}

#[test]
fn perl_classes_are_ascii_as_in_go() {
    assert!(matches("^\\d$", "7"));
    assert!(!matches("^\\d$", "٣"), "an Arabic-Indic digit is not Go's \\d");
    assert!(!matches("^\\w$", "é"));
    assert!(matches("^\\W$", "é"));
    assert!(!matches("^\\s$", "\u{0b}"), "Go's \\s has no vertical tab");
    assert!(matches("^[\\d\\s]+$", "1 2\t3"));
    assert!(matches("^[^\\d]$", "x"));
    assert!(matches("^[\\D]$", "x") && !matches("^[\\D]$", "5"));
    // é is not a word character to Go's \b.
    assert!(matches("a\\bé", "aé") && !matches("a\\Bé", "aé"));
    assert!(!matches("\\bé", "a é"));
}

#[test]
fn a_brace_that_starts_no_repetition_is_literal() {
    assert!(matches("^{\"a\":1}$", "{\"a\":1}"));
    assert!(matches("^a{2}$", "aa") && !matches("^a{2}$", "a{2}"));
    assert!(matches("^a{,2}$", "a{,2}"), "Go reads {{,2}} literally");
    assert!(matches("^x{1,3}$", "xxx"));
}

#[test]
fn quoted_text_and_class_punctuation_are_literal() {
    assert!(matches("^\\Qa.b*\\E$", "a.b*") && !matches("^\\Qa.b*\\E$", "axbb"));
    assert!(matches("^\\Qa.b", "a.b"));
    assert!(matches("^[a&&b]+$", "a&&b"), "no intersection in a Go class");
    assert!(matches("^[~]$", "~"));
    assert!(matches("^[[]$", "["));
    assert!(matches("^[]a]+$", "]a"));
}

#[test]
fn refusals_are_typed() {
    assert_eq!(
        compile("\\C").unwrap_err(),
        Error::Unsupported { what: "\\C (any byte)" }
    );
    let long = "a".repeat(MAX_PATTERN + 1);
    assert_eq!(compile(&long).unwrap_err(), Error::TooLong { len: MAX_PATTERN + 1 });
    match compile("(a").unwrap_err() {
        Error::Syntax { why } => assert!(why.contains("unclosed group"), "{why}"),
        e => panic!("{e:?}"),
    }
    match compile("(\\w{1000}){1000}").unwrap_err() {
        Error::Syntax { why } => assert!(why.contains("size limit") || why.contains("exceeds"), "{why}"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn bytes_follow_the_same_dialect() {
    let re = compile_bytes("(?i)^\\+OK\\s\\w+{").unwrap();
    assert!(re.is_match(b"+ok ready{") && !re.is_match(b"+ok r\xc3\xa9{"));
    assert!(compile_bytes("\\C").is_err());
}
