//! A real systemd-journald of a journal namespace of the test's own
//! (`systemd-journald NAMESPACE`): no system journald need run, and the
//! host's journal is not touched. Entries go to its native socket; its
//! files are in `/var/log/journal/<machine-id>.<namespace>`, which a
//! journald monitor's `logPath` (and `journalctl --directory`) reads. The
//! daemon is killed and its files removed when the value drops.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The program (Debian's `systemd` package).
pub const JOURNALD: &str = "/usr/lib/systemd/systemd-journald";

/// A journald of one namespace.
pub struct Journald {
    child: Child,
    /// Its socket for native entries.
    pub socket: PathBuf,
    /// The directory of its journal files.
    pub dir: PathBuf,
    runtime: PathBuf,
}

impl Journald {
    /// Starts one in a fresh namespace (`sonde-test-<n>`); `None` when the
    /// program is not there or cannot run (not root), said on stderr.
    pub fn start() -> Option<Self> {
        let machine = std::fs::read_to_string("/etc/machine-id").ok()?.trim().to_string();
        let ns = format!("sonde-test-{}", fastrand::u32(..));
        let child = match Command::new(JOURNALD)
            .arg(&ns)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cannot start {JOURNALD}: {e}");
                return None;
            }
        };
        let runtime = PathBuf::from(format!("/run/systemd/journal.{ns}"));
        let journal = Self {
            child,
            socket: runtime.join("socket"),
            dir: PathBuf::from(format!("/var/log/journal/{machine}.{ns}")),
            runtime,
        };
        // Ready once its socket and its file are there.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(journal.socket.exists() && journal.dir.join("system.journal").exists()) {
            if Instant::now() > deadline {
                eprintln!("{JOURNALD} {ns}: no socket or journal file after 10s");
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(journal)
    }

    /// Writes an entry of `identifier` saying `message`.
    pub fn send(&self, identifier: &str, message: &str) {
        let sock = UnixDatagram::unbound().unwrap();
        let entry = format!("MESSAGE={message}\nSYSLOG_IDENTIFIER={identifier}\nPRIORITY=6\n");
        sock.send_to(entry.as_bytes(), &self.socket).unwrap();
    }
}

impl Drop for Journald {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.runtime);
    }
}
