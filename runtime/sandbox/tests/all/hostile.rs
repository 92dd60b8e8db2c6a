//! Hostile guests against the executor: every limit and every grant.

use crate::support::{accepted_before_now, builtin, engine, guest, run, run_alone, run_with_limits};
use sonde_sandbox::engine::{CacheOutcome, Engine, EngineConfig, Limits, LoadError};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, Status};
use sonde_tests::{CountingListener, closed_port, guests, peak_rss};
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_plugin_is_stopped_at_its_deadline_without_holding_up_others() {
    let spin = guest(guests::SPIN_FOREVER).await;
    let up = guest(guests::ALWAYS_UP).await;
    let started = Instant::now();
    // Fuel enough that only the deadline can stop it.
    let limits = Limits {
        timeout: 2 * SECOND,
        fuel: u64::MAX,
        ..Limits::default()
    };
    let spinner = tokio::spawn(async move { run_with_limits(&spin, limits).await });
    // While the spinner holds a worker, other runs on the same runtime go on.
    let mut quick = 0;
    while !spinner.is_finished() && quick < 50 {
        let r = run(&up, "", "{}", &Grants::default(), SECOND).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        quick += 1;
    }
    assert!(
        !spinner.is_finished(),
        "50 quick runs should finish well inside the spinner's 2s deadline"
    );
    let r = spinner.await.unwrap();
    assert_eq!((r.status, r.reason), (Status::Failure, Some(Reason::Timeout)), "{r:?}");
    assert!(r.duration >= 2 * SECOND, "stopped early: {:?}", r.duration);
    assert!(started.elapsed() < 10 * SECOND, "stopped late: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_in_a_host_call_is_stopped_at_the_deadline() {
    let r = run(
        &guest(guests::SLEEP_IN_HOST).await,
        "",
        "{}",
        &Grants::default(),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, Some(Reason::Timeout)), "{r:?}");
    assert!(r.duration < 5 * SECOND, "{:?}", r.duration);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burning_fuel_is_a_fuel_error() {
    let limits = Limits {
        fuel: 1_000_000,
        timeout: 30 * SECOND,
        ..Limits::default()
    };
    let r = run_with_limits(&guest(guests::BURN_FUEL).await, limits).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Fuel)), "{r:?}");
    assert_eq!(r.fuel_consumed, 1_000_000);
    assert!(r.is_error());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_memory_forever_is_a_memory_error_and_host_memory_stays_bounded() {
    let plugin = guest(guests::ALLOC_FOREVER).await;
    let before = peak_rss();
    let limits = Limits {
        memory: 32 * 1024 * 1024,
        timeout: 30 * SECOND,
        ..Limits::default()
    };
    for _ in 0..3 {
        let r = run_with_limits(&plugin, limits).await;
        assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Memory)), "{r:?}");
    }
    let grown = peak_rss().saturating_sub(before);
    assert!(
        grown < 256 * 1024 * 1024,
        "host peak RSS grew by {grown} bytes for a 32 MiB cap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_a_trap_with_the_panic_message() {
    let r = run_alone(guests::PANIC_IN_CHECK).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Trap)), "{r:?}");
    assert!(r.message.contains("the plugin has a bug"), "{}", r.message);
}

/// Without std the panic message cannot go to stderr: the SDK logs it and
/// the host reports it with the trap all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_without_std_is_a_trap_with_the_panic_message() {
    let r = run_alone(guests::PANIC_NO_STD).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Trap)), "{r:?}");
    assert!(r.message.contains("no_std plugin bug at attempt 1"), "{}", r.message);
    assert!(
        r.message.contains("panicked at") && r.message.contains("src/lib.rs"),
        "{}",
        r.message
    );
}

/// The SDK's allocator without std (wasi-libc's `malloc`, and
/// `aligned_alloc` for stricter alignments, moved by hand on `realloc`)
/// keeps blocks aligned and their contents through growth, and a plugin
/// that exhausts it is stopped by the host's memory cap like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocator_without_std_aligns_keeps_and_is_capped() {
    let plugin = guest(guests::ALLOC_NO_STD).await;
    let r = run(&plugin, "", "\"aligned\"", &Grants::default(), 5 * SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = run(&plugin, "", "\"exhaust\"", &Grants::default(), 30 * SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Memory)), "{r:?}");
    for config in ["\"lifo\"", "\"churn\""] {
        let r = run(&plugin, "", config, &Grants::default(), 30 * SECOND).await;
        assert_eq!(r.status, Status::Success, "{config}: {r:?}");
    }
}

/// The SDK's `arena` allocator (without std, a bump allocator whose free
/// only gives back the latest block) keeps the same promises: aligned
/// blocks that keep their contents, the memory cap, and a block freed
/// right after it was allocated taken again. What it gives up, reusing a
/// block freed out of order, ends the call at the memory cap as
/// documented, never beyond it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arena_allocator_aligns_keeps_reuses_the_latest_and_is_capped() {
    let plugin = guest(guests::ALLOC_ARENA).await;
    for config in ["\"aligned\"", "\"lifo\""] {
        let r = run(&plugin, "", config, &Grants::default(), 30 * SECOND).await;
        assert_eq!(r.status, Status::Success, "{config}: {r:?}");
    }
    for config in ["\"exhaust\"", "\"churn\""] {
        let r = run(&plugin, "", config, &Grants::default(), 30 * SECOND).await;
        assert_eq!(
            (r.status, r.reason),
            (Status::Unknown, Some(Reason::Memory)),
            "{config}: {r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_elsewhere_is_denied_and_never_reaches_the_listener() {
    let target = CountingListener::start().await;
    let elsewhere = CountingListener::start().await;
    let config = format!(r#"{{"addr": "{}"}}"#, elsewhere.addr);
    let plugin = guest(guests::CONNECT_ELSEWHERE).await;
    let r = run(&plugin, &target.addr.to_string(), &config, &Grants::default(), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains(&elsewhere.addr.to_string()), "{}", r.message);
    assert_eq!(accepted_before_now(elsewhere.addr, || elsewhere.accepted()).await, 0);

    // The same address, granted, is reached.
    let grants = Grants {
        net: vec![elsewhere.addr.to_string().parse().unwrap()],
        ..Grants::default()
    };
    let r = run(&plugin, &target.addr.to_string(), &config, &grants, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(accepted_before_now(elsewhere.addr, || elsewhere.accepted()).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_up_an_ungranted_name_is_denied() {
    let r = run(
        &guest(guests::LOOKUP_ELSEWHERE).await,
        "127.0.0.1:9",
        "{}",
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("sonde-exfiltration.invalid"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_to_an_ungranted_host_is_denied_and_sends_nothing() {
    // Through sonde's probe transport (`send` and `send-keeping`) and
    // through standard wasi:http.
    for (plugin, config) in [
        (guests::HTTP_ELSEWHERE, r#"{"url": "http://{}/"}"#),
        (guests::HTTP_ELSEWHERE, r#"{"url": "http://{}/", "keep": ["location"]}"#),
        (guests::WASI_HTTP_ELSEWHERE, r#"{"authority": "{}"}"#),
    ] {
        let elsewhere = CountingListener::start().await;
        let config = config.replace("{}", &elsewhere.addr.to_string());
        let target = closed_port().to_string();
        let r = run(&guest(plugin).await, &target, &config, &Grants::default(), SECOND).await;
        assert_eq!(
            (r.status, r.reason),
            (Status::Unknown, Some(Reason::Denied)),
            "{plugin} {config}: {r:?}"
        );
        assert!(r.message.contains("HTTP request"), "{}", r.message);
        let reached = accepted_before_now(elsewhere.addr, || elsewhere.accepted()).await;
        assert_eq!(reached, 0, "{plugin} {config}");
    }
}

/// issue 16, escape 1: an IPv6 grant (`[::/0]:PORT`) does not reach IPv4
/// loopback through its v4-mapped address, by the host's `tcp`, `tls`,
/// `http` or `grpc`, nor by the plugin's own socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v4_mapped_address_does_not_reach_ipv4_through_an_ipv6_grant() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let plugin = guest(guests::V4_MAPPED_ESCAPE).await;
    let config = serde_json::json!({ "port": port }).to_string();
    let target = closed_port().to_string();
    let ipv6_only = Grants {
        net: vec![format!("[::/0]:{port}").parse().unwrap()],
        ..Grants::default()
    };
    let r = run(&plugin, &target, &config, &ipv6_only, SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(
        r.message
            .starts_with(&format!("denied: TCP connection to ::ffff:127.0.0.1:{port}")),
        "{}",
        r.message
    );
    // tcp, tls, http and grpc: each one refused. (wasmtime-wasi refuses a
    // v4-mapped address on the plugin's own socket as invalid before any
    // grant check; the accept queue below shows it connected nowhere.)
    assert!(r.message.ends_with("(and 3 more)"), "{}", r.message);
    // A connection the host or the plugin made would be waiting in the
    // accept queue by the time the call returned.
    let accepted = listener.accept().map(|(_, peer)| peer);
    assert_eq!(
        accepted.as_ref().map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "{accepted:?}"
    );

    // Granted IPv4, the same address is reached. Connections are closed
    // as soon as they are accepted, so TLS, HTTP and gRPC fail at once.
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let (accepted, mut connections) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        while let Ok((_, peer)) = listener.accept().await {
            let _ = accepted.send(peer);
        }
    });
    let ipv4 = Grants {
        net: vec![format!("127.0.0.1:{port}").parse().unwrap()],
        ..Grants::default()
    };
    let r = run(&plugin, &target, &config, &ipv4, SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.starts_with("tcp: true;"), "{}", r.message);
    assert!(connections.recv().await.is_some());
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_file_without_a_grant_is_denied() {
    let r = run(&guest(guests::OPEN_FILE).await, "", "{}", &Grants::default(), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("/etc/passwd"), "{}", r.message);

    // With a grant of /etc, the same plugin reads the file.
    let grants = Grants {
        files: vec!["/etc".into()],
        ..Grants::default()
    };
    let r = run(&guest(guests::OPEN_FILE).await, "", "{}", &grants, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("Ok("), "{}", r.message);
}

/// A plugin that trips over a denial on its way to a trap (a Python
/// traceback reads its source files) is `denied`, and the message says
/// why it stopped too: the denial alone sends its author looking for a
/// grant instead of the bug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_after_a_denial_is_denied_and_says_why_it_trapped() {
    let r = run_alone(guests::STAT_SOURCE_THEN_PANIC).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.starts_with("denied: filesystem "), "{}", r.message);
    assert!(r.message.contains("/0/app.py: no `files` granted"), "{}", r.message);
    assert!(r.message.contains("trapped"), "{}", r.message);
    assert!(
        r.message.contains("missing 2 required positional arguments"),
        "{}",
        r.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_outputs_are_cut_to_the_caps() {
    use sonde_sandbox::engine::limits::{MAX_DETAIL_BYTES, MAX_MESSAGE_BYTES, MAX_METRICS};
    let r = run(
        &guest(guests::HUGE_MESSAGE).await,
        "",
        "{}",
        &Grants::default(),
        5 * SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{:?}", r.reason);
    assert!(r.message.len() <= MAX_MESSAGE_BYTES && r.message.ends_with("[cut]"));
    assert!(r.detail.as_ref().unwrap().len() <= MAX_DETAIL_BYTES);
    assert_eq!(r.metrics.len(), MAX_METRICS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_is_capped_and_the_outcome_still_counts() {
    let r = run(
        &guest(guests::LOG_FLOOD).await,
        "",
        "{}",
        &Grants::default(),
        10 * SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_defaults_to_the_crate_name_and_version() {
    let p = guest(guests::ALWAYS_UP).await;
    assert_eq!(p.info().name, "always_up");
    assert_eq!(p.info().version, "0.0.0");
    assert!(
        p.imports().iter().any(|i| i.starts_with("sonde:probe/types")),
        "{:?}",
        p.imports()
    );
}

/// The built-ins the benchmarks measure are built without std, so they
/// import what they call and nothing of std's (the CLI's stdio,
/// environment and exit, the sockets, random): each import costs every
/// instantiation (docs/performance-notes.md, "What std's WASI imports cost a call").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_std_builtins_import_only_what_they_call() {
    for (name, wanted) in [
        ("tcp", &["sonde:probe/tcp", "sonde:probe/tls"][..]),
        ("dns", &["sonde:probe/udp", "sonde:probe/tcp"][..]),
        ("http", &["sonde:probe/http"][..]),
        ("exec", &["sonde:probe/exec"][..]),
        ("grpc", &["sonde:probe/grpc"][..]),
        ("tls-cert", &["sonde:probe/tls"][..]),
        ("file-age", &["wasi:filesystem/preopens"][..]),
        ("icmp", &["sonde:probe/icmp"][..]),
    ] {
        let p = builtin(name).await;
        let imports = p.imports();
        for w in wanted {
            assert!(imports.iter().any(|i| i.starts_with(w)), "{name}: {imports:?}");
        }
        for i in imports {
            let allowed = ["sonde:probe/", "wasi:clocks/", "wasi:filesystem/", "wasi:io/"];
            assert!(
                allowed.iter().any(|a| i.starts_with(a)),
                "{name} imports {i}: {imports:?}"
            );
        }
    }
    // The trivial plugin is built without the SDK's `panic-message`, and
    // so without the log import: the types and the clock of `remaining()`.
    let p = guest(guests::ALWAYS_UP).await;
    assert_eq!(p.imports().len(), 2, "{:?}", p.imports());
    assert!(
        !p.imports().iter().any(|i| i.starts_with("sonde:probe/log")),
        "{:?}",
        p.imports()
    );
}

/// wasmtime resets a function table of one page (512 entries) after each
/// call by clearing it, and a larger one with a page scan, a syscall that
/// cost the tcp and http plugins ~1 µs per call when regex's literal
/// prefilters took their tables past 700 entries (docs/performance-notes.md).
#[test]
fn builtins_function_tables_fit_in_one_page() {
    for name in sonde_builtins::names() {
        // dns writes records of every type hickory-proto knows as text
        // (its validators match that text), ~630 entries: a check that
        // waits for a DNS round trip does not notice a microsecond more.
        let bound = if name == "dns" { 1024 } else { 512 };
        let wasm = sonde_builtins::get(name).expect("built-in");
        for payload in wasmparser::Parser::new(0).parse_all(wasm) {
            if let Ok(wasmparser::Payload::TableSection(tables)) = payload {
                for table in tables {
                    let entries = table.expect("table").ty.initial;
                    assert!(entries <= bound, "{name}: a table of {entries} entries");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_components_are_refused_with_the_reason() {
    let e = engine();
    let err = e.load("text", b"hello world").await.err().unwrap();
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err}");
    // The smallest valid core module: magic and version 1.
    let err = e.load("core", b"\0asm\x01\0\0\0").await.err().unwrap();
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err}");
    assert!(err.to_string().contains("wasm32-wasip2"), "{err}");
    let err = e.load_file(guests::NOT_A_PLUGIN.as_ref()).await.err().unwrap();
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err}");
    let err = e.load_file("/nonexistent/plugin.wasm".as_ref()).await.err().unwrap();
    assert!(matches!(err, LoadError::Read { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_engine_loads_compiled_components_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        cache_dir: Some(dir.path().join("cache")),
        ..EngineConfig::default()
    };
    let wasm = std::fs::read(guests::ALWAYS_UP).unwrap();
    let first = Engine::new(config.clone()).unwrap().load("up", &wasm).await.unwrap();
    assert_eq!(first.cache_outcome(), CacheOutcome::Miss);
    let second_engine = Engine::new(config).unwrap();
    let second = second_engine.load("up", &wasm).await.unwrap();
    assert_eq!(second.cache_outcome(), CacheOutcome::Hit);
    assert_eq!(second_engine.cache_stats(), (1, 0));
    let r = run(&guest(guests::ALWAYS_UP).await, "", "{}", &Grants::default(), SECOND).await;
    assert_eq!(r.status, Status::Success);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_cache_entry_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let wasm = std::fs::read(guests::ALWAYS_UP).unwrap();
    Engine::new(config.clone()).unwrap().load("up", &wasm).await.unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            std::fs::write(&path, b"garbage").unwrap();
        }
    }
    let again = Engine::new(config).unwrap().load("up", &wasm).await.unwrap();
    assert_eq!(again.cache_outcome(), CacheOutcome::Miss);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_of_one_plugin_compile_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(EngineConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    })
    .unwrap();
    let wasm = std::fs::read(guests::ALWAYS_UP).unwrap();
    let loads: Vec<_> = (0..8)
        .map(|i| {
            let (engine, wasm) = (engine.clone(), wasm.clone());
            tokio::spawn(async move { engine.load(&format!("copy {i}"), &wasm).await.unwrap() })
        })
        .collect();
    let mut plugins = Vec::new();
    for load in loads {
        plugins.push(load.await.unwrap());
    }
    assert!(plugins.iter().all(|p| std::sync::Arc::ptr_eq(p, &plugins[0])));
    assert_eq!(engine.cache_stats(), (0, 1));
}
