//! Text from a plugin, made safe before the host keeps, logs or shows it.

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    const MARK: &str = "…[cut]";
    let mut end = max.saturating_sub(MARK.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(MARK);
    s
}

/// Text a plugin wrote, made safe to show (the one boundary where plugin
/// text enters the host: results, log records, `describe`, denials): every
/// control character — newline, carriage return, escape, the C1 range — is
/// written as its Rust escape (`\n`, `\u{1b}`), so the text can neither
/// forge a log line nor drive a terminal; then it is cut to `max` bytes.
pub fn plugin_text(s: String, max: usize) -> String {
    // Cut first so a huge text costs no huge copy; escaping at most
    // multiplies the length by 8 (`\u{9b}` for a 2-byte character: ×4).
    let s = truncate(s, max);
    if !s.chars().any(char::is_control) {
        return s;
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    truncate(out, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_text_has_no_control_characters() {
        let forged = "ok\n2026-11-24T04:00:00Z  INFO sonde: all good\r\u{1b}[2J\u{9b}31m\tend".to_string();
        let shown = plugin_text(forged, 1024);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            "ok\\n2026-11-24T04:00:00Z  INFO sonde: all good\\r\\u{1b}[2J\\u{9b}31m\\tend"
        );
        assert_eq!(plugin_text("plain é".into(), 1024), "plain é");
        let long = plugin_text("\u{1b}".repeat(1000), 100);
        assert!(long.len() <= 100 && !long.chars().any(char::is_control), "{long:?}");
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        let s = "é".repeat(100);
        let t = truncate(s, 21);
        assert!(t.len() <= 21, "{}", t.len());
        assert!(t.ends_with("…[cut]"));
        assert_eq!(truncate("short".into(), 10), "short");
    }
}
