//! Containment of the programs the host runs (`exec` for plugins, targets'
//! actions): the program and everything it starts — children started
//! with `setsid`, double forks, daemons — die together when the run ends.
//!
//! Two modes, chosen once per process ([`Containment::in_force`]):
//!
//! - **cgroup**: where sonde's own cgroup v2 is writable (a systemd unit
//!   with `Delegate=yes`, a container with its cgroup mounted read-write),
//!   each run gets a cgroup of its own, `<sonde's cgroup>/sonde-exec.<pid>/
//!   run-<n>`, which the program enters before it executes. The run ends
//!   with `cgroup.kill`, which kills every process in it at once, whatever
//!   its session or parent. Where the `pids` and `memory` controllers are
//!   delegated, `pids.max` and `memory.max` bound each run as well
//!   ([`RunLimits`]: for a plugin's `exec`, the probe's memory cap and the
//!   agent's `sandbox.exec_pids`).
//! - **subreaper**: elsewhere, the program is started under a small
//!   supervisor, started beside the agent ([`super::spawn`]: it shares the
//!   agent's memory, so nothing is copied), that is a child subreaper
//!   (`PR_SET_CHILD_SUBREAPER`): whatever the program leaves behind is
//!   re-parented to the supervisor instead of escaping to init. When the
//!   program exits, or the agent asks (SIGTERM, also sent by the kernel if
//!   the agent dies), the supervisor kills every descendant it has and
//!   reaps them before it exits itself. Everything under it belongs to this
//!   one run, so nothing else is ever killed.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The most processes one run may have at once, where the `pids`
/// controller is delegated, by default (`sandbox.exec_pids`).
pub(crate) const MAX_RUN_PIDS: u32 = 64;
/// The most memory one run may use, where the `memory` controller is
/// delegated, for a run that has no probe (a target's action).
pub(crate) const MAX_RUN_MEMORY_BYTES: u64 = 256 * 1024 * 1024;

/// What bounds one run's cgroup: `pids.max` and `memory.max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// `pids.max`: the most processes at once.
    pub pids: u32,
    /// `memory.max`, in bytes.
    pub memory: u64,
}

impl Default for RunLimits {
    /// The bounds of a run that has no probe: [`MAX_RUN_PIDS`] and
    /// [`MAX_RUN_MEMORY_BYTES`].
    fn default() -> Self {
        Self {
            pids: MAX_RUN_PIDS,
            memory: MAX_RUN_MEMORY_BYTES,
        }
    }
}

/// How the host contains the programs it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Containment {
    /// A cgroup v2 per run, created under `parent` and ended with
    /// `cgroup.kill`.
    Cgroup {
        /// The directory the runs' cgroups are created in.
        parent: PathBuf,
        /// The controllers bounding each run (`pids`, `memory`), if any.
        limits: Vec<&'static str>,
    },
    /// A supervisor per run that is a child subreaper and sweeps the run's
    /// descendants when it ends.
    Subreaper,
}

impl Containment {
    /// The mode this process uses, detected on first use; the agent's start
    /// line shows it (`exec_containment=`).
    pub fn in_force() -> &'static Containment {
        static MODE: OnceLock<Containment> = OnceLock::new();
        MODE.get_or_init(|| {
            let mode = Self::detect();
            tracing::debug!(containment = %mode.describe(), "exec'd programs are contained");
            mode
        })
    }

    /// The strongest mode this process can use: a cgroup per run if its own
    /// cgroup v2 is writable and has `cgroup.kill`, else the subreaper.
    pub fn detect() -> Self {
        match cgroup_parent() {
            Ok((parent, limits)) => Self::Cgroup { parent, limits },
            Err(why) => {
                tracing::debug!(%why, "no writable cgroup v2 for exec'd programs");
                Self::Subreaper
            }
        }
    }

    /// One line for logs and `sonde check`: the mode and what it bounds.
    pub fn describe(&self) -> String {
        match self {
            Self::Cgroup { parent, limits } if limits.is_empty() => {
                format!(
                    "cgroup per run under {} (kill only; no pids or memory controller delegated)",
                    parent.display()
                )
            }
            Self::Cgroup { parent, limits } => {
                format!(
                    "cgroup per run under {} (kill, {})",
                    parent.display(),
                    limits.join(", ")
                )
            }
            Self::Subreaper => "subreaper per run (no cgroup v2 delegated to sonde)".into(),
        }
    }
}

/// Removes what earlier sonde processes, now gone, left in `own`: their
/// `sonde-exec.<pid>` directories and the run cgroups in them, killing
/// whatever still runs there.
fn remove_stale(own: &Path) {
    let Ok(entries) = std::fs::read_dir(own) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("sonde-exec.")) else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        // A sonde killed outright (SIGKILL) leaves its runs' programs: they
        // die now.
        for run in std::fs::read_dir(entry.path()).into_iter().flatten().flatten() {
            let _ = std::fs::write(run.path().join("cgroup.kill"), "1");
            let _ = std::fs::remove_dir(run.path());
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// Why exec'd programs get no cgroup of their own (they run under the
/// subreaper instead).
#[derive(Debug, thiserror::Error)]
enum NoCgroup {
    #[error("{path}: {source}")]
    Read { path: &'static str, source: std::io::Error },
    #[error("no cgroup v2 membership")]
    NotMember,
    #[error("no cgroup2 mount")]
    NoMount,
    #[error("{}: {source}", path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("the kernel has no cgroup.kill")]
    NoKill,
}

/// sonde's own cgroup v2 directory, from `/proc/self/cgroup` and the
/// cgroup2 mount in `/proc/self/mountinfo`, and whether it is the root.
fn own_cgroup() -> Result<(PathBuf, bool), NoCgroup> {
    let read = |path: &'static str| std::fs::read_to_string(path).map_err(|source| NoCgroup::Read { path, source });
    let cgroups = read("/proc/self/cgroup")?;
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(NoCgroup::NotMember)?;
    let mounts = read("/proc/self/mountinfo")?;
    // "id parent major:minor root mountpoint options... - fstype source ..."
    let mount = mounts
        .lines()
        .find_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            (after.split(' ').next() == Some("cgroup2") && fields.get(3) == Some(&"/"))
                .then(|| fields.get(4).copied())?
        })
        .ok_or(NoCgroup::NoMount)?;
    let path = path.trim().trim_start_matches('/');
    Ok((Path::new(mount).join(path), path.is_empty()))
}

/// Creates the directory the runs' cgroups go in and enables what
/// controllers it can for them.
fn cgroup_parent() -> Result<(PathBuf, Vec<&'static str>), NoCgroup> {
    let (own, is_root) = own_cgroup()?;
    remove_stale(&own);
    let parent = own.join(format!("sonde-exec.{}", std::process::id()));
    match std::fs::create_dir(&parent) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(NoCgroup::Create { path: parent, source }),
    }
    if !parent.join("cgroup.kill").exists() {
        let _ = std::fs::remove_dir(&parent);
        return Err(NoCgroup::NoKill);
    }
    // Controllers must be enabled in every cgroup from sonde's down. sonde
    // enables one for its children only in a delegated cgroup (never in
    // the root's, which would change every cgroup of the machine); a cgroup
    // holding processes cannot, so without a delegation prepared for it
    // (see docs/security.md) the runs are killable but not bounded.
    let available = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
    let enabled = std::fs::read_to_string(own.join("cgroup.subtree_control")).unwrap_or_default();
    let mut limits = Vec::new();
    for controller in ["pids", "memory"] {
        let has = |list: &str| list.split_whitespace().any(|c| c == controller);
        let enable = format!("+{controller}");
        let for_children = has(&enabled)
            || (!is_root && has(&available) && std::fs::write(own.join("cgroup.subtree_control"), &enable).is_ok());
        if for_children && std::fs::write(parent.join("cgroup.subtree_control"), &enable).is_ok() {
            limits.push(controller);
        }
    }
    Ok((parent, limits))
}

/// Writes `run` into the cgroup `dir`, for each of the `controllers`
/// delegated.
fn write_limits(dir: &Path, controllers: &[&'static str], run: RunLimits) -> std::io::Result<()> {
    if controllers.contains(&"pids") {
        std::fs::write(dir.join("pids.max"), run.pids.to_string())?;
    }
    if controllers.contains(&"memory") {
        std::fs::write(dir.join("memory.max"), run.memory.to_string())?;
        // The memory of a run that exceeds it is not worth swapping.
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
    }
    Ok(())
}

/// The most empty run cgroups kept for reuse, per parent (an agent has
/// one). Creating and removing a
/// cgroup is most of what containment costs a run (measured: ~150 µs of a
/// `/bin/true` run's ~980 µs); an empty one is as good as a new one.
pub const IDLE_RUN_CGROUPS: usize = 32;

/// Empty run cgroups, with their `cgroup.procs` open, for the next runs.
static IDLE: std::sync::Mutex<Vec<RunCgroup>> = std::sync::Mutex::new(Vec::new());

/// One run's cgroup: taken (or created) before the program starts; when
/// the run ends, kept for another run if nothing is left in it, else killed
/// and removed (also when the guard is dropped).
pub(crate) struct RunCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for the program to write itself into.
    procs: OwnedFd,
    /// `cgroup.events`, open for reading whether the run left anything.
    events: OwnedFd,
}

impl RunCgroup {
    /// Creates the cgroup of a new run under `parent`, bounded by
    /// `run` through the `controllers` delegated.
    pub(crate) fn create(parent: &Path, controllers: &[&'static str], run: RunLimits) -> std::io::Result<Self> {
        let idle = {
            let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
            let found = idle.iter().rposition(|c| c.dir.parent() == Some(parent));
            found.map(|i| idle.swap_remove(i))
        };
        if let Some(cgroup) = idle {
            write_limits(&cgroup.dir, controllers, run)?;
            return Ok(cgroup);
        }
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let dir = parent.join(format!("run-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir)?;
        write_limits(&dir, controllers, run)?;
        let procs = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
        let events = std::fs::File::open(dir.join("cgroup.events"))?;
        Ok(Self {
            dir,
            procs: procs.into(),
            events: events.into(),
        })
    }

    /// The descriptor the program writes `0` to, to enter the cgroup.
    pub(crate) fn procs(&self) -> BorrowedFd<'_> {
        self.procs.as_fd()
    }

    /// Kills every process in the cgroup.
    fn kill(&self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
    }

    /// Whether no process is left in the cgroup (`populated 0`).
    fn is_empty(&self) -> bool {
        // One read of the descriptor opened with the cgroup (kernfs gives
        // the current state at offset 0), not an open per run.
        let mut buf = [0u8; 256];
        let Ok(n) = rustix::io::pread(&self.events, &mut buf, 0) else {
            return false;
        };
        buf[..n].split(|&b| b == b'\n').any(|l| l == b"populated 0")
    }

    /// Ends the run: a cgroup nothing is left in is kept for another run;
    /// otherwise every process in it is killed and it is removed once
    /// empty.
    pub(crate) async fn end(mut self) {
        if self.is_empty() {
            let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
            let parent = self.dir.parent();
            if idle.iter().filter(|c| c.dir.parent() == parent).count() < IDLE_RUN_CGROUPS {
                idle.push(self);
                return;
            }
        }
        self.kill();
        let dir = std::mem::take(&mut self.dir);
        drop(self);
        remove_when_empty(dir).await;
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if self.dir.as_os_str().is_empty() {
            return; // ended
        }
        self.kill();
        // Dropped without `end` (the call was cancelled): remove the
        // cgroup in the background once its processes are gone.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(remove_when_empty(std::mem::take(&mut self.dir)));
        }
    }
}

/// Removes an empty cgroup directory, waiting for killed processes to
/// leave it (they do within milliseconds; a process stuck in the kernel
/// may take longer, and then the directory is left for later runs of
/// `sonde` to find empty).
async fn remove_when_empty(dir: PathBuf) {
    let mut wait = Duration::from_millis(1);
    for _ in 0..12 {
        match std::fs::remove_dir(&dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            _ => return,
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
    tracing::warn!(cgroup = %dir.display(), "an exec'd program's cgroup is still busy after its kill");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_cgroup_is_bounded_by_the_limits_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunLimits {
            pids: 7,
            memory: 32 << 20,
        };
        write_limits(dir.path(), &["pids", "memory"], run).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert_eq!(read("pids.max"), "7");
        assert_eq!(read("memory.max"), (32u64 << 20).to_string());
        let only_pids = tempfile::tempdir().unwrap();
        write_limits(only_pids.path(), &["pids"], RunLimits::default()).unwrap();
        assert_eq!(
            std::fs::read_to_string(only_pids.path().join("pids.max")).unwrap(),
            "64"
        );
        assert!(!only_pids.path().join("memory.max").exists());
    }
}
