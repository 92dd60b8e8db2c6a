//! The last `bufferSize` lines, and a rule's match against them as NPD's
//! log buffer makes it: the lines joined with `\n` (a slot not yet filled
//! is an empty line), the pattern anchored at the end (`\z`), and the lines
//! from the one where the leftmost match starts to the last.

use std::collections::VecDeque;
use std::time::SystemTime;

/// A line of a log, as a monitor matches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// When it was written.
    pub at: SystemTime,
    /// Its message.
    pub message: String,
}

/// The last lines, at most `capacity`.
#[derive(Debug)]
pub struct LogBuffer {
    lines: VecDeque<Entry>,
    capacity: usize,
    /// The lines joined, until the next push.
    joined: Option<String>,
}

impl LogBuffer {
    /// An empty buffer of `capacity` lines (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            lines: VecDeque::with_capacity(capacity),
            capacity,
            joined: None,
        }
    }

    /// Adds `entry`, the oldest going when the buffer is full.
    pub fn push(&mut self, entry: Entry) {
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back(entry);
        self.joined = None;
    }

    /// The lines `pattern` (anchored at the end already) matches, oldest
    /// first; empty when it does not match.
    pub fn matched(&mut self, pattern: &sonde_regex::Regex) -> Vec<&Entry> {
        let capacity = self.capacity;
        let lines = &self.lines;
        let joined = self.joined.get_or_insert_with(|| {
            // NPD's ring starts full of empty lines.
            let empty = capacity - lines.len();
            let mut text = "\n".repeat(empty);
            for (i, l) in lines.iter().enumerate() {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str(&l.message);
            }
            if lines.is_empty() {
                text.pop();
            }
            text
        });
        let Some(found) = pattern.find(joined) else {
            return Vec::new();
        };
        // How far back from the end the match starts; the lines from the
        // last back to the one holding that start.
        let back = joined.len() - found.start();
        let mut total = 0;
        let mut taken = 0;
        for l in self.lines.iter().rev() {
            taken += 1;
            total += l.message.len() + 1;
            if total >= back {
                break;
            }
        }
        self.lines.iter().skip(self.lines.len() - taken).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(capacity: usize, lines: &[&str]) -> LogBuffer {
        let mut b = LogBuffer::new(capacity);
        for l in lines {
            b.push(Entry {
                at: SystemTime::UNIX_EPOCH,
                message: l.to_string(),
            });
        }
        b
    }

    fn rule(pattern: &str) -> sonde_regex::Regex {
        sonde_regex::compile(&format!("{pattern}\\z")).unwrap()
    }

    fn messages(found: Vec<&Entry>) -> Vec<&str> {
        found.iter().map(|e| e.message.as_str()).collect()
    }

    #[test]
    fn a_pattern_matches_at_the_end_only_and_takes_whole_lines() {
        let mut b = buffer(10, &["EXT4-fs error on sda1", "all is well"]);
        assert!(b.matched(&rule("EXT4-fs error .*")).is_empty(), "not the last line");
        b.push(Entry {
            at: SystemTime::UNIX_EPOCH,
            message: "kernel: EXT4-fs error on sda2".into(),
        });
        assert_eq!(
            messages(b.matched(&rule("EXT4-fs error .*"))),
            ["kernel: EXT4-fs error on sda2"],
            "the whole line, not the matched part"
        );
    }

    #[test]
    fn a_multi_line_pattern_takes_the_lines_it_spans() {
        let mut b = buffer(3, &["zero", "INFO: task x blocked", "Call Trace:", "end"]);
        assert_eq!(
            messages(b.matched(&rule("task x blocked\\nCall Trace:\\n.*"))),
            ["INFO: task x blocked", "Call Trace:", "end"]
        );
        assert!(
            b.matched(&rule("zero\\n(?s).*")).is_empty(),
            "zero left the 3-line buffer"
        );
    }

    #[test]
    fn an_empty_slot_is_an_empty_line_as_in_npd() {
        let mut b = buffer(3, &["x"]);
        // `\n\nx`: a pattern may span the unfilled slots; only real lines
        // are reported.
        assert_eq!(messages(b.matched(&rule("\\n\\nx"))), ["x"]);
        assert!(buffer(3, &[]).matched(&rule("x")).is_empty());
    }

    #[test]
    fn an_unanchored_alternative_is_as_npd_leaves_it() {
        // NPD appends `\z` without a group: `a|b\z` anchors `b` only.
        let mut b = buffer(10, &["a here", "then something else"]);
        assert_eq!(
            messages(b.matched(&rule("a here|b"))),
            ["a here", "then something else"]
        );
    }
}
