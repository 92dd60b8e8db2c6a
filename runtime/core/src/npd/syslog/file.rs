//! A text file followed as NPD's filelog watcher follows it: read from its
//! start (the monitor's start time drops what is old), polled every
//! [`POLL`] at its end, opened again when it is replaced or truncated (a
//! rotation). Each line's time and message are found by the file's
//! `timestamp` and `message` patterns (the last group of each) and its Go
//! time layout; a line that has neither, or a `skipList` entry, is passed
//! over. A line is read at most `max_line_bytes` long: the rest of a longer
//! one is skipped without being held.

use super::{Line, SourceError};
use crate::config::{LogPattern, TimeLayout};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncSeekExt, BufReader};

/// How often the end of the file is looked at again (NPD's 500ms).
pub const POLL: Duration = Duration::from_millis(500);

/// How a file's lines are read.
pub struct FileSpec {
    /// The file.
    pub path: PathBuf,
    /// Where a line's time is.
    pub timestamp: LogPattern,
    /// Where a line's message is.
    pub message: LogPattern,
    /// The time's Go layout.
    pub format: TimeLayout,
    /// A line holding one of these is passed over.
    pub skip: Vec<String>,
    /// A line's longest length, in bytes.
    pub max_line: usize,
}

/// The open file: its reader, inode and offset.
struct Open {
    reader: BufReader<tokio::fs::File>,
    inode: (u64, u64),
    offset: u64,
}

/// A followed file.
pub struct FileLog {
    spec: FileSpec,
    open: Option<Open>,
    pending: Vec<u8>,
    cut: bool,
}

impl FileLog {
    /// Opens `spec.path` (it must be there, as NPD wants it).
    pub async fn open(spec: FileSpec) -> Result<Self, SourceError> {
        let open = Some(reopen(&spec.path).await?);
        Ok(Self {
            spec,
            open,
            pending: Vec::new(),
            cut: false,
        })
    }

    /// The next line that has a time and a message.
    pub async fn next(&mut self) -> Result<Line, SourceError> {
        loop {
            let raw = self.next_raw().await?;
            if self.spec.skip.iter().any(|s| raw.contains(s.as_str())) {
                continue;
            }
            match translate(&self.spec, &raw) {
                Some(mut line) => {
                    line.cut = std::mem::take(&mut self.cut);
                    return Ok(line);
                }
                None => {
                    self.cut = false;
                    tracing::debug!(file = %self.spec.path.display(), line = raw, "a log line without the file's time or message");
                }
            }
        }
    }

    /// The next whole line, without its `\n`, at most `max_line` bytes.
    async fn next_raw(&mut self) -> Result<String, SourceError> {
        loop {
            let Some(open) = self.open.as_mut() else {
                tokio::time::sleep(POLL).await;
                self.open = reopen(&self.spec.path).await.ok();
                continue;
            };
            let buf = open.reader.fill_buf().await.map_err(SourceError::Read)?;
            if buf.is_empty() {
                tokio::time::sleep(POLL).await;
                if rotated(&self.spec.path, open).await {
                    tracing::info!(file = %self.spec.path.display(), "log file rotated; reading the new one");
                    self.open = reopen(&self.spec.path).await.ok();
                }
                continue;
            }
            let (chunk, newline) = match buf.iter().position(|b| *b == b'\n') {
                Some(n) => (&buf[..n], true),
                None => (buf, false),
            };
            let room = self.spec.max_line.saturating_sub(self.pending.len());
            self.pending.extend_from_slice(&chunk[..chunk.len().min(room)]);
            self.cut |= chunk.len() > room;
            let used = chunk.len() + usize::from(newline);
            open.reader.consume(used);
            open.offset += used as u64;
            if newline {
                let line = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return Ok(line);
            }
        }
    }
}

async fn reopen(path: &PathBuf) -> Result<Open, SourceError> {
    let err = |e| SourceError::Open {
        path: path.clone(),
        source: e,
    };
    let mut file = tokio::fs::File::open(path).await.map_err(err)?;
    let meta = file.metadata().await.map_err(err)?;
    file.rewind().await.map_err(err)?;
    Ok(Open {
        reader: BufReader::new(file),
        inode: (meta.dev(), meta.ino()),
        offset: 0,
    })
}

/// Whether the file at `path` is another one than `open`, or shorter than
/// what was read of it.
async fn rotated(path: &PathBuf, open: &Open) -> bool {
    match tokio::fs::metadata(path).await {
        Ok(m) => (m.dev(), m.ino()) != open.inode || m.len() < open.offset,
        Err(_) => false,
    }
}

/// The last group `pattern` finds in `text` (the whole match when it has
/// none; an empty text when that group took no part), as Go's
/// `FindStringSubmatch` read from its end.
fn last_group<'t>(pattern: &LogPattern, text: &'t str) -> Option<&'t str> {
    let caps = pattern.regex.captures(text)?;
    Some(caps.get(caps.len() - 1).map_or("", |m| m.as_str()))
}

/// `raw`'s time and message, by the file's patterns and layout.
fn translate(spec: &FileSpec, raw: &str) -> Option<Line> {
    let at = spec.format.parse(last_group(&spec.timestamp, raw)?).ok()?;
    let message = last_group(&spec.message, raw)?.to_string();
    Some(Line {
        at,
        message,
        cut: false,
    })
}
