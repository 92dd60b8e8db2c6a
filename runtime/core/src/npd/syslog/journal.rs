//! The systemd journal, the entries of one `SYSLOG_IDENTIFIER`, read
//! through `journalctl --output=json --follow` (docs/kubernetes.md says
//! why a program and not a library): from the monitor's start time on,
//! from the directory `logPath` names or the system's journal. Reading
//! needs the journal's files: root, or the group `systemd-journal`.

use super::{Line, SourceError};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// The program, looked up on `PATH`.
pub const JOURNALCTL: &str = "journalctl";

/// The longest JSON entry read: a longer one is skipped.
const MAX_ENTRY: usize = 256 * 1024;

/// `journalctl` following the journal.
pub struct Journal {
    child: tokio::process::Child,
    out: BufReader<tokio::process::ChildStdout>,
    entry: Vec<u8>,
}

impl Journal {
    /// Starts `journalctl` on `dir` (else the system's journal) for the
    /// entries of `identifier` from `since` on.
    pub fn open(dir: Option<&PathBuf>, identifier: &str, since: SystemTime) -> Result<Self, SourceError> {
        let since = since.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let mut cmd = tokio::process::Command::new(JOURNALCTL);
        cmd.args(["--output=json", "--follow", "--lines=all", "--no-pager", "--quiet"])
            .arg(format!("--since=@{}.{:06}", since.as_secs(), since.subsec_micros()))
            .arg(format!("SYSLOG_IDENTIFIER={identifier}"));
        if let Some(dir) = dir {
            cmd.arg(format!("--directory={}", dir.display()));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SourceError::Open {
                path: JOURNALCTL.into(),
                source: e,
            })?;
        let out = child.stdout.take().ok_or(SourceError::Ended)?;
        Ok(Self {
            child,
            out: BufReader::new(out),
            entry: Vec::new(),
        })
    }

    /// The next entry with a message.
    pub async fn next(&mut self) -> Result<Line, SourceError> {
        loop {
            self.entry.clear();
            let n = (&mut self.out)
                .take(MAX_ENTRY as u64)
                .read_until(b'\n', &mut self.entry)
                .await
                .map_err(SourceError::Read)?;
            if n == 0 {
                let _ = self.child.wait().await;
                return Err(SourceError::Ended);
            }
            if self.entry.last() != Some(&b'\n') {
                // Longer than MAX_ENTRY: skip to its end.
                let mut rest = Vec::new();
                while !rest.ends_with(b"\n") {
                    rest.clear();
                    let n = (&mut self.out)
                        .take(MAX_ENTRY as u64)
                        .read_until(b'\n', &mut rest)
                        .await
                        .map_err(SourceError::Read)?;
                    if n == 0 {
                        break;
                    }
                }
                continue;
            }
            if let Some(line) = parse(&self.entry) {
                return Ok(line);
            }
        }
    }
}

/// An entry's line: its `__REALTIME_TIMESTAMP` and its `MESSAGE` (text,
/// or bytes as journalctl writes a message that is not), trimmed.
pub fn parse(entry: &[u8]) -> Option<Line> {
    let v: serde_json::Value = serde_json::from_slice(entry).ok()?;
    let micros: u64 = v.get("__REALTIME_TIMESTAMP")?.as_str()?.parse().ok()?;
    let message = match v.get("MESSAGE")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(bytes) => {
            let bytes: Vec<u8> = bytes.iter().filter_map(|b| b.as_u64().map(|b| b as u8)).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        _ => return None,
    };
    Some(Line {
        at: SystemTime::UNIX_EPOCH + Duration::from_micros(micros),
        message: message.trim().to_string(),
        cut: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_gives_its_time_and_message() {
        let l = parse(br#"{"__REALTIME_TIMESTAMP":"1795829400000001","MESSAGE":" Started kubelet.service. ","SYSLOG_IDENTIFIER":"systemd"}"#).unwrap();
        assert_eq!(
            l.at,
            SystemTime::UNIX_EPOCH + Duration::from_micros(1_795_829_400_000_001)
        );
        assert_eq!(l.message, "Started kubelet.service.");
        let bytes = parse(br#"{"__REALTIME_TIMESTAMP":"1","MESSAGE":[104,105,255]}"#).unwrap();
        assert_eq!(bytes.message, "hi\u{fffd}");
        assert!(parse(br#"{"MESSAGE":"no time"}"#).is_none());
        assert!(parse(b"not json").is_none());
    }
}
