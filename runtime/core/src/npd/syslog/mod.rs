//! node-problem-detector's system-log monitor, run by sonde: a monitor
//! file's log source (`kmsg`, `filelog`, `journald`) read line by line,
//! bounded ([`limit`]), each line pushed into the last `bufferSize` lines
//! ([`buffer`]) and every rule's pattern matched against them; a match
//! becomes an Event or sets a condition ([`state`]), as NPD decides it.
//!
//! Lines written before the monitor's start time are not matched: that is
//! the later of boot time plus `delay` and now less `lookback`, as NPD
//! reckons it when the monitor starts.

pub mod buffer;
pub mod file;
pub mod journal;
pub mod kmsg;
pub mod limit;
pub mod state;

use super::{Report, Sink};
use crate::catalog::npd::LogMonitor;
use crate::config::LogSource;
use buffer::{Entry, LogBuffer};
use state::LogState;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long a source that failed or ended waits before it is opened again
/// (NPD's kmsg watcher waits as long).
pub const RETRY: Duration = Duration::from_secs(5);

/// A line as a source gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// When it was written.
    pub at: SystemTime,
    /// Its message.
    pub message: String,
    /// Whether the source cut it (it was longer than `max_line_bytes`).
    pub cut: bool,
}

/// Why a source cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Opening it (or starting `journalctl`) failed.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file, device or program.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading it failed.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// It ended (`journalctl` exited).
    #[error("the source ended")]
    Ended,
}

/// What became of a line read, for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LineOutcome {
    /// Matched against the rules.
    Read,
    /// Matched, cut to `max_line_bytes` first.
    Cut,
    /// Dropped: over `max_lines_per_second`.
    Dropped,
}

impl LineOutcome {
    /// Its label on `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Cut => "cut",
            Self::Dropped => "dropped",
        }
    }
}

/// A source, open.
enum Source {
    Kmsg(kmsg::Kmsg),
    File(file::FileLog),
    Journal(journal::Journal),
}

impl Source {
    async fn open(monitor: &LogMonitor, start: SystemTime) -> Result<Self, SourceError> {
        let m = &monitor.monitor;
        Ok(match &m.log {
            LogSource::Kmsg => Self::Kmsg(kmsg::Kmsg::open()?),
            LogSource::File {
                path,
                timestamp,
                message,
                format,
            } => Self::File(
                file::FileLog::open(file::FileSpec {
                    path: path.clone(),
                    timestamp: timestamp.clone(),
                    message: message.clone(),
                    format: format.clone(),
                    skip: m.skip_list.clone(),
                    max_line: monitor.bounds.max_line_bytes,
                })
                .await?,
            ),
            LogSource::Journal { dir, identifier } => Self::Journal(journal::Journal::open(
                dir.as_ref(),
                identifier,
                start.min(SystemTime::now()),
            )?),
        })
    }

    async fn next(&mut self) -> Result<Line, SourceError> {
        match self {
            Self::Kmsg(s) => s.next().await,
            Self::File(s) => s.next().await,
            Self::Journal(s) => s.next().await,
        }
    }
}

/// The earliest time a line may have to be matched: the later of `boot`
/// plus `delay` and `now` less `lookback`.
pub fn start_time(boot: SystemTime, now: SystemTime, lookback: Duration, delay: Duration) -> SystemTime {
    let after_boot = boot + delay;
    let looked_back = now.checked_sub(lookback).unwrap_or(SystemTime::UNIX_EPOCH);
    after_boot.max(looked_back)
}

/// A monitor's lines matched against its rules, and what each match
/// changes.
pub struct Matcher {
    monitor: Arc<LogMonitor>,
    buffer: LogBuffer,
    state: LogState,
    limit: limit::RateLimit,
}

impl Matcher {
    /// `monitor`'s conditions at their defaults, its buffer empty, as of
    /// `now`.
    pub fn new(monitor: Arc<LogMonitor>, now: SystemTime) -> Self {
        let m = &monitor.monitor;
        Self {
            buffer: LogBuffer::new(m.buffer_lines),
            state: LogState::new(m, now),
            limit: limit::RateLimit::new(monitor.bounds.max_lines_per_second, tokio::time::Instant::now()),
            monitor,
        }
    }

    /// The conditions as they are.
    pub fn conditions(&self) -> &[super::Condition] {
        self.state.conditions()
    }

    /// What `line` changes (its outcome, for `/metrics`): bounded, pushed,
    /// every rule matched in the file's order.
    pub fn push(&mut self, mut line: Line) -> (LineOutcome, Vec<Report>) {
        if !self.limit.admit(tokio::time::Instant::now()) {
            return (LineOutcome::Dropped, Vec::new());
        }
        let cut = limit::cut(&mut line.message, self.monitor.bounds.max_line_bytes) || line.cut;
        self.buffer.push(Entry {
            at: line.at,
            message: line.message,
        });
        let mut reports = Vec::new();
        for rule in &self.monitor.monitor.rules {
            let matched = self.buffer.matched(&rule.pattern.regex);
            let Some(first) = matched.first() else { continue };
            let at = first.at;
            let mut message = matched
                .iter()
                .map(|e| e.message.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            if !rule.message_suffix.is_empty() {
                message = format!("{message}; {}", rule.message_suffix);
            }
            reports.extend(self.state.apply(rule, &message, at));
        }
        (if cut { LineOutcome::Cut } else { LineOutcome::Read }, reports)
    }
}

/// Runs `monitor` until the task is dropped, reporting to `sink`: first
/// each condition at its default, then what each line read changes. A
/// source that cannot be opened, or fails, is opened again after
/// [`RETRY`] (logged each time).
pub async fn run(monitor: Arc<LogMonitor>, sink: Arc<dyn Sink>) {
    let source = monitor.monitor.source.clone();
    let mut matcher = Matcher::new(monitor.clone(), SystemTime::now());
    for c in matcher.conditions() {
        sink.report(&source, &Report::Condition(c.clone()));
    }
    let m = &monitor.monitor;
    let mut start = start_time(kmsg::boot_time(), SystemTime::now(), m.lookback, m.delay);
    loop {
        let mut lines = match Source::open(&monitor, start).await {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, file = %monitor.file.display(), source, "node-problem-detector log monitor cannot read its log; trying again");
                tokio::time::sleep(RETRY).await;
                start = start.max(SystemTime::now());
                continue;
            }
        };
        loop {
            let line = match lines.next().await {
                Ok(l) => l,
                Err(error) => {
                    tracing::warn!(%error, file = %monitor.file.display(), source, "node-problem-detector log monitor lost its log; opening it again");
                    break;
                }
            };
            if line.at < start {
                continue;
            }
            let (outcome, reports) = matcher.push(line);
            sink.line(&source, outcome);
            for r in &reports {
                sink.report(&source, r);
            }
        }
        // Opened again, a source gives what it gave already: only what is
        // new is matched (NPD's kmsg watcher seeks to the end).
        tokio::time::sleep(RETRY).await;
        start = start.max(SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LogBounds, NpdFile};

    fn matcher(bounds: LogBounds) -> Matcher {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.json");
        std::fs::write(
            &file,
            r#"{"plugin": "kmsg", "source": "s", "rules": [{"type": "temporary", "reason": "Hit", "pattern": "hit .*"}]}"#,
        )
        .unwrap();
        let NpdFile::Log(monitor) = NpdFile::read(&file, dir.path()).unwrap() else {
            panic!("a log monitor")
        };
        Matcher::new(Arc::new(LogMonitor { file, monitor, bounds }), SystemTime::now())
    }

    fn line(message: &str) -> Line {
        Line {
            at: SystemTime::now(),
            message: message.into(),
            cut: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn lines_past_the_rate_are_dropped_unmatched_and_a_long_one_is_cut_then_matched() {
        let mut m = matcher(LogBounds {
            max_line_bytes: 64,
            max_lines_per_second: 3,
        });
        let (outcome, reports) = m.push(line(&format!("hit {}", "x".repeat(100))));
        assert_eq!(outcome, LineOutcome::Cut);
        assert!(
            matches!(&reports[..], [Report::Event { message, .. }] if message.len() == 64),
            "matched as cut: {reports:?}"
        );
        assert_eq!(m.push(line("quiet")).0, LineOutcome::Read);
        assert_eq!(m.push(line("quiet")).0, LineOutcome::Read);
        let (outcome, reports) = m.push(line("hit dropped"));
        assert_eq!(outcome, LineOutcome::Dropped, "the fourth line of the second");
        assert!(reports.is_empty(), "a dropped line is not matched");
        tokio::time::advance(Duration::from_millis(334)).await;
        let (outcome, reports) = m.push(line("hit again"));
        assert_eq!(outcome, LineOutcome::Read, "a third of a second refills a line");
        assert_eq!(reports.len(), 1);
    }

    #[test]
    fn the_start_is_the_later_of_boot_plus_delay_and_now_less_lookback() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let m = Duration::from_secs(60);
        assert_eq!(start_time(t(1000), t(5000), 5 * m, Duration::ZERO), t(4700));
        assert_eq!(
            start_time(t(4900), t(5000), 5 * m, Duration::ZERO),
            t(4900),
            "booted 100s ago"
        );
        assert_eq!(
            start_time(t(1000), t(5000), Duration::ZERO, Duration::ZERO),
            t(5000),
            "NPD's default lookback: now"
        );
        assert_eq!(start_time(t(4900), t(5000), 5 * m, m), t(4960), "delay after boot");
    }
}
