//! sonde's integration harness: the hostile test guests, built from
//! `tests/guests/` by the build script, and small real servers to probe.
//!
//! Each guest is named by what it does wrong (`spin_forever`,
//! `connect_elsewhere`…); [`guests`] holds the path of each component.

#![deny(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Paths of the test guests' components.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// A TCP listener on loopback that accepts and counts connections, for
/// proving that a plugin did or did not reach it.
pub struct CountingListener {
    /// Where it listens.
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingListener {
    /// Starts listening on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { addr, accepted, task }
    }

    /// How many connections it accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for CountingListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback port with nothing listening on it (bound, then released).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = l.local_addr().expect("local addr");
    drop(l);
    addr
}

/// This process's peak resident set size (VmHWM), in bytes.
pub fn peak_rss() -> u64 {
    status_field("VmHWM:")
}

/// This process's resident set size (VmRSS), in bytes.
pub fn rss() -> u64 {
    status_field("VmRSS:")
}

fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The processes of process group `pgid` that are still alive (zombies,
/// already dead and waiting for a parent to reap them, do not count).
pub fn live_processes_in_group(pgid: i32) -> Vec<i32> {
    let mut live = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return live;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, pgrp, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) && fields.first() != Some(&"Z") {
            live.push(pid);
        }
    }
    live
}

/// A real `redis-server` (Debian's package) on a free loopback port, with
/// persistence off; killed when dropped.
pub struct RedisServer {
    /// Where it listens.
    pub addr: SocketAddr,
    child: std::process::Child,
}

impl RedisServer {
    /// Starts `redis-server` and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (`.ci/run` installs it) or does
    /// not come up within ten seconds.
    pub fn start() -> Self {
        let addr = closed_port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &addr.port().to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is not installed: apt-get install redis-server");
        let server = Self { addr, child };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start on {addr}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
