//! The kernel's log, read from `/dev/kmsg` as NPD reads it: one record per
//! read, `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE`, its time the boot
//! time plus the microseconds. The record's continuation lines (the
//! ` KEY=value` dictionary a driver adds) are left out of the message.
//! Reading needs the right to read the device: root, or `CAP_SYSLOG` when
//! `kernel.dmesg_restrict` is 1.

use super::{Line, SourceError};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, SystemTime};
use tokio::io::unix::AsyncFd;

/// The device.
pub const KMSG: &str = "/dev/kmsg";

/// The longest record the kernel writes (its `PRINTK_MESSAGE_MAX` and
/// dictionary fit); a read gives a whole record or fails.
const RECORD: usize = 8192;

/// `/dev/kmsg`, open from its oldest record.
pub struct Kmsg {
    fd: AsyncFd<std::fs::File>,
    boot: SystemTime,
    buf: Vec<u8>,
}

impl Kmsg {
    /// Opens the device.
    pub fn open() -> Result<Self, SourceError> {
        let open = |e| SourceError::Open {
            path: KMSG.into(),
            source: e,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(KMSG)
            .map_err(open)?;
        // SAFETY: the `AsyncFd` owns the file, whose descriptor stays open
        // until the `AsyncFd` is dropped (and deregistered).
        #[allow(unsafe_code, reason = "registering the descriptor of the file the AsyncFd owns")]
        let fd = unsafe { AsyncFd::register_with_interest(file, tokio::io::Interest::READABLE) };
        Ok(Self {
            fd: fd.map_err(|e| open(e.into()))?,
            boot: boot_time(),
            buf: vec![0; RECORD],
        })
    }

    /// The next record with a message.
    pub async fn next(&mut self) -> Result<Line, SourceError> {
        loop {
            let mut ready = self.fd.readable().await.map_err(SourceError::Read)?;
            let buf = &mut self.buf;
            match ready.try_io(|f| (&mut f.get_ref()).read(buf)) {
                Err(_would_block) => continue,
                // Overwritten before it was read: the next is there.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => continue,
                Ok(Err(e)) => return Err(SourceError::Read(e)),
                Ok(Ok(0)) => return Err(SourceError::Ended),
                Ok(Ok(n)) => {
                    if let Some(line) = parse(&self.buf[..n], self.boot) {
                        return Ok(line);
                    }
                }
            }
        }
    }
}

/// When the machine booted: now less the time since boot.
pub fn boot_time() -> SystemTime {
    let up = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let up = Duration::new(up.tv_sec.max(0) as u64, up.tv_nsec.clamp(0, 999_999_999) as u32);
    SystemTime::now().checked_sub(up).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// A record's line: its time and its message (continuation lines left
/// out, trimmed); none when it is not a record or its message is empty.
pub fn parse(record: &[u8], boot: SystemTime) -> Option<Line> {
    let text = String::from_utf8_lossy(record);
    let (meta, message) = text.split_once(';')?;
    let mut fields = meta.split(',');
    let (_priority, _sequence, micros) = (fields.next()?, fields.next()?, fields.next()?);
    let micros: u64 = micros.parse().ok()?;
    let message = message.split('\n').next().unwrap_or("").trim();
    if message.is_empty() {
        return None;
    }
    Some(Line {
        at: boot + Duration::from_micros(micros),
        message: message.to_string(),
        cut: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_gives_its_time_and_first_line() {
        let boot = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(
            parse(
                b"6,339,5140900,-;NET: Registered protocol family 10\n SUBSYSTEM=net\n DEVICE=n1\n",
                boot
            ),
            Some(Line {
                at: boot + Duration::from_micros(5_140_900),
                message: "NET: Registered protocol family 10".into(),
                cut: false
            })
        );
        assert_eq!(
            parse(b"12,348,40593903022,-;  spaced \\x0a escaped\n", boot).map(|l| l.message),
            Some("spaced \\x0a escaped".into()),
            "trimmed; the kernel's escapes stay as NPD leaves them"
        );
        assert_eq!(parse(b"6,1,2,-;\n", boot), None, "an empty message");
        assert_eq!(parse(b"no record", boot), None);
        assert_eq!(parse(b"6,1;x", boot), None, "too few fields");
        assert_eq!(parse(b"6,1,x,-;x", boot), None, "no microseconds");
    }
}
