//! Everything a plugin can make the host hold is bounded: hostile guests
//! that hoard sockets and `wasi:http` fields end `unknown` with reason
//! `host-limit`, give back what they held, and do not fail another
//! tenant's probe running at the same time.

use crate::support::{check, engine_with, guest, run_alone, run_on};
use bytesize::ByteSize;
use sonde_sandbox::host::Grants;
use sonde_sandbox::host::bounds::{
    ARGUMENT_BYTES, HostLimits, LOOKUPS_PER_CALL, RANDOM_BYTES, SOCKETS_PER_CALL, TABLE_ENTRIES_PER_CALL,
};
use sonde_sandbox::verdict::{Reason, Status};
use sonde_tests::{CountingListener, guests};
use std::collections::HashSet;
use std::time::Duration;

/// The inodes of the sockets the kernel lists as bound, connected or
/// listening (TCP, UDP, Unix).
fn listed_socket_inodes() -> HashSet<String> {
    let mut inodes = HashSet::new();
    for table in ["tcp", "tcp6", "udp", "udp6", "unix"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/self/net/{table}")) else {
            continue;
        };
        let column = if table == "unix" { 6 } else { 9 };
        for line in text.lines().skip(1) {
            if let Some(inode) = line.split_whitespace().nth(column) {
                inodes.insert(inode.to_string());
            }
        }
    }
    inodes
}

/// This process's sockets that are neither bound nor connected: what a
/// plugin creating sockets without connecting them leaves behind. Other
/// tests' sockets are connected or listening, so they do not count.
fn unconnected_sockets() -> usize {
    let listed = listed_socket_inodes();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy();
            t.strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .map(str::to_string)
        })
        .filter(|inode| !listed.contains(inode))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_hoarder_ends_host_limit_gives_its_sockets_back_and_hurts_no_one() {
    let hoarder = guest(guests::HOARD_SOCKETS).await;
    let listener = CountingListener::start().await;
    let before = unconnected_sockets();
    let target = listener.addr.to_string();
    let no_grants = Grants::default();
    let (hoarded, other) = tokio::join!(
        crate::support::run(&hoarder, "", "{}", &no_grants, Duration::from_secs(5)),
        // Another tenant's probe at the same time.
        check("tcp", &target, "{}", Duration::from_secs(5)),
    );
    assert_host_limit(&hoarded, &format!("more than {SOCKETS_PER_CALL} sockets"));
    assert_eq!(other.status, Status::Success, "{other:?}");
    // The store is dropped when the run returns: its sockets are closed.
    let after = unconnected_sockets();
    assert!(
        after <= before + 8,
        "{before} unconnected sockets before the hoarder, {after} after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fields_hoarder_ends_host_limit() {
    let r = run_alone(guests::HOARD_FIELDS).await;
    assert_host_limit(&r, &format!("more than {TABLE_ENTRIES_PER_CALL} host resources"));
}

/// issue 16, finding 5: a connection the host opens for sonde's `http` or
/// `grpc` is a socket like any other; a plugin opening one after another
/// runs into the call's socket bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_through_http_and_grpc_count_against_the_socket_bound() {
    let hoarder = guest(guests::HOARD_CONNECTIONS).await;
    for transport in ["http", "grpc"] {
        let listener = CountingListener::start().await;
        let target = listener.addr.to_string();
        let config = format!("{{\"transport\": \"{transport}\"}}");
        let r = crate::support::run(&hoarder, &target, &config, &Grants::default(), Duration::from_secs(20)).await;
        assert_host_limit(&r, &format!("more than {SOCKETS_PER_CALL} sockets"));
        let accepted = crate::support::accepted_before_now(listener.addr, || listener.accepted()).await;
        assert!(
            accepted <= SOCKETS_PER_CALL,
            "{transport}: the host opened {accepted} connections for one call"
        );
    }
}

/// issue 16, finding 4: `wasi:sockets` name lookups are the host's own and
/// bounded per call: the fifth in flight is refused and the run is
/// `host-limit`.
#[tokio::test]
async fn wasi_lookups_in_flight_are_bounded_per_call() {
    let flood = guest(guests::FLOOD_WASI_LOOKUPS).await;
    let r = crate::support::run(
        &flood,
        "localhost:80",
        "{}",
        &Grants::default(),
        Duration::from_secs(10),
    )
    .await;
    assert_host_limit(&r, &format!("more than {LOOKUPS_PER_CALL} name lookups in flight"));
}

/// A `list<string>` whose strings all point at the same bytes: 120
/// strings of 1 MiB in 960 bytes of guest memory, passed through a sonde
/// interface, `exec` and `wasi:http`. The host copies arguments before any
/// of its code runs; past `sandbox.argument_bytes` wasmtime stops copying
/// and the run is `host-limit`. Under the bound the copy is made and the
/// host refuses the call itself (too many names, no exec grant, a field
/// too large), as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliased_arguments_are_bounded_by_what_one_host_call_may_copy() {
    let aliaser = guest(guests::ALIAS_ARGUMENTS).await;
    // Under the bound, each host function's own answer.
    let refusals = [
        ("keep", "120 response headers to keep, at most 64"),
        ("exec", "denied: exec aaaa"),
        ("fields", "bytes in one fields"),
    ];
    for (via, refusal) in refusals {
        let run = |bytes: usize| {
            let config = format!(r#"{{"via": "{via}", "count": 120, "bytes": {bytes}}}"#);
            let aliaser = aliaser.clone();
            async move { crate::support::run(&aliaser, "", &config, &Grants::default(), Duration::from_secs(10)).await }
        };
        let r = run(1 << 20).await;
        assert_host_limit(
            &r,
            &format!("more than {} to one host call", ByteSize(ARGUMENT_BYTES as u64)),
        );
        let r = run(1 << 10).await;
        assert!(r.message.contains(refusal), "{via}: {r:?}");
    }
}

/// `wasi:random` hands back at most `RANDOM_BYTES` per call: the host
/// makes and holds them before the copy into the guest, whose memory cap
/// comes too late to bound them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_are_bounded_per_call() {
    let asker = guest(guests::HUGE_RANDOM).await;
    let no_grants = Grants::default();
    let timeout = Duration::from_secs(10);
    let r = crate::support::run(&asker, "", &RANDOM_BYTES.to_string(), &no_grants, timeout).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.message, format!("{RANDOM_BYTES} random bytes"));
    let r = crate::support::run(&asker, "", "50331648", &no_grants, timeout).await;
    assert_host_limit(&r, &format!("more than {} of random bytes", ByteSize(RANDOM_BYTES)));
}

/// The run ended `unknown`, reason `host-limit`, with a message naming the
/// bound (`what`).
fn assert_host_limit(r: &sonde_sandbox::verdict::RunResult, what: &str) {
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::HostLimit)),
        "{r:?}"
    );
    assert!(r.message.contains(what), "not {what:?}: {}", r.message);
}

/// Two engines in one process, each with its own bounds, running the
/// same hoarder at the same time: each run names its own engine's bound;
/// a change to one engine's bounds leaves the other's as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_in_one_process_each_enforce_their_own_bounds() {
    let small = engine_with(HostLimits {
        sockets_per_call: 3,
        ..HostLimits::default()
    });
    let large = engine_with(HostLimits {
        sockets_per_call: 7,
        ..HostLimits::default()
    });
    let hoarder = guest(guests::HOARD_SOCKETS).await;
    let shared = crate::support::engine();
    let on_small = small.load_file(guests::HOARD_SOCKETS.as_ref()).await.unwrap();
    let on_large = large.load_file(guests::HOARD_SOCKETS.as_ref()).await.unwrap();
    let timeout = Duration::from_secs(10);
    let (a, b, c) = tokio::join!(
        run_on(&small, &on_small, "", "{}", timeout),
        run_on(&large, &on_large, "", "{}", timeout),
        // The tests' shared engine: the defaults.
        run_on(&shared, &hoarder, "", "{}", timeout),
    );
    for (r, n) in [(&a, 3), (&b, 7), (&c, SOCKETS_PER_CALL)] {
        assert_eq!(
            (r.status, r.reason),
            (Status::Unknown, Some(Reason::HostLimit)),
            "{r:?}"
        );
        assert!(
            r.message.contains(&format!("more than {n} sockets")),
            "{n}: {}",
            r.message
        );
    }
    // A reload's change to one engine is that engine's alone.
    small.set_host_limits(HostLimits {
        sockets_per_call: 5,
        ..HostLimits::default()
    });
    let (a, b) = tokio::join!(
        run_on(&small, &on_small, "", "{}", timeout),
        run_on(&large, &on_large, "", "{}", timeout),
    );
    assert!(a.message.contains("more than 5 sockets"), "{a:?}");
    assert!(b.message.contains("more than 7 sockets"), "{b:?}");
}
