//! Containment of plugin work: exec'd programs die whole with their run
//! (in each containment mode this machine can run), and the agent keeps no
//! token in its environment.

use crate::support::{builtin, cache_dir, run, sonde_with_mounts};
use sonde_sandbox::host::Grants;
use sonde_sandbox::host::contain::Containment;
use sonde_sandbox::host::contain::RunLimits;
use sonde_sandbox::host::exec::run_contained;
use sonde_sandbox::verdict::Status;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `pid` is a live process (a zombie, dead and waiting to be
/// reaped, is not).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z")
}

/// The pids the script wrote to `dir/pids`.
fn pids_in(dir: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    text.split_whitespace().map(|p| p.parse().unwrap()).collect()
}

/// A shell script that escapes a process-group kill twice over — a child in
/// a session of its own, and a double fork — both holding stdout and
/// sleeping, records their pids in `dir/pids`, prints a line, and then
/// `rest`.
fn escaping_script(dir: &Path, rest: &str) -> String {
    let pids = dir.join("pids");
    let pids = pids.display();
    format!(
        "setsid sleep 1000 & echo $! >> {pids}\n\
         (sleep 1000 & echo $! >> {pids}) &\n\
         wait $!\n\
         echo hello\n\
         {rest}"
    )
}

/// The modes this machine can run: the subreaper, which runs anywhere, and
/// a cgroup per run — where sonde would find one, else (as root) in a
/// cgroup2 hierarchy mounted for the tests, kill-only as no controller is
/// delegated there.
fn modes() -> Vec<Containment> {
    let mut modes = vec![Containment::Subreaper];
    match Containment::detect() {
        Containment::Subreaper => modes.extend(mounted_cgroup2()),
        cgroup => modes.push(cgroup),
    }
    modes
}

/// A cgroup mode in a cgroup2 hierarchy mounted under the target directory
/// (once; left mounted for the next run), for machines with cgroup v1 only.
fn mounted_cgroup2() -> Option<Containment> {
    static MODE: std::sync::OnceLock<Option<Containment>> = std::sync::OnceLock::new();
    MODE.get_or_init(|| {
        if rustix::process::geteuid().as_raw() != 0 {
            return None;
        }
        let mount = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cgroup2");
        std::fs::create_dir_all(&mount).ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mounted = mounts
            .lines()
            .any(|l| l.contains(&format!(" {} ", mount.display())) && l.contains(" - cgroup2 "));
        if !mounted {
            let status = Command::new("mount")
                .args(["-t", "cgroup2", "none"])
                .arg(&mount)
                .status()
                .ok()?;
            if !status.success() {
                return None;
            }
        }
        let parent = mount.join(format!("sonde-test.{}", std::process::id()));
        std::fs::create_dir_all(&parent).ok()?;
        parent.join("cgroup.kill").exists().then(|| Containment::Cgroup {
            parent,
            limits: Vec::new(),
        })
    })
    .clone()
}

#[test]
fn the_tests_contain_in_both_modes_as_root() {
    if rustix::process::geteuid().as_raw() == 0 {
        assert_eq!(modes().len(), 2, "{:?}", modes());
    }
}

/// Runs `argv` in `mode` with `env`, a 30 s timeout and default limits.
async fn run_in(
    mode: &Containment,
    argv: &[&str],
    env: &[(String, String)],
) -> Result<sonde_sandbox::host::exec::ProgramOutput, String> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    run_contained(&argv, env, Duration::from_secs(30), mode, RunLimits::default())
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_starts_clean_in_its_own_group_with_nothing_of_the_agents() {
    let env = [("ONLY".to_string(), "this".to_string())];
    // The report, one line each: pgrp and pid, cwd, stdin, environment,
    // and the signal state (blocked, ignored).
    let script = "echo $(cut -d' ' -f5 /proc/$$/stat) $$; pwd; readlink /proc/$$/fd/0; env | grep -v '^PWD=' | sort | tr '\\n' ' '; echo; grep -E '^Sig(Blk|Ign)' /proc/$$/status | tr -s '\\t' ' '";
    for mode in modes() {
        let out = run_in(&mode, &["/bin/sh", "-c", script], &env).await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.exit_code, Some(0), "{mode:?}: {out:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        let (pgrp, pid) = lines[0].split_once(' ').unwrap();
        assert_eq!(pgrp, pid, "{mode:?}: not a group of its own");
        assert_eq!(lines[1], "/", "{mode:?}");
        assert_eq!(lines[2], "/dev/null", "{mode:?}");
        assert_eq!(lines[3].trim(), "ONLY=this", "{mode:?}");
        // The test binary ignores SIGPIPE (and what its parent ignored), the
        // runtime handles SIGCHLD: the program gets nothing ignored and
        // nothing blocked.
        assert!(lines[4].contains("SigBlk: 0000000000000000"), "{mode:?}: {stdout}");
        assert!(lines[5].contains("SigIgn: 0000000000000000"), "{mode:?}: {stdout}");
        // Its descriptors: 0-2, and the one `ls` opens for the listing.
        // Nothing of the agent's leaks in, not even what it (or cargo's
        // jobserver, for this test binary) left without close-on-exec.
        let leak = std::fs::File::open("/dev/null").unwrap();
        let leak = std::os::fd::OwnedFd::from(leak);
        rustix::io::fcntl_setfd(&leak, rustix::io::FdFlags::empty()).unwrap();
        let out = run_in(&mode, &["/bin/ls", "/proc/self/fd"], &[]).await.unwrap();
        let fds = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        assert_eq!(fds, ["0", "1", "2", "3"], "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_cannot_execute_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("plain");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let plain = not_executable.to_str().unwrap();
    for mode in modes() {
        let missing = run_in(&mode, &["/nonexistent/program"], &[]).await.unwrap_err();
        assert!(
            missing.contains("/nonexistent/program: No such file or directory"),
            "{mode:?}: {missing}"
        );
        let denied = run_in(&mode, &[plain], &[]).await.unwrap_err();
        assert!(denied.contains("Permission denied"), "{mode:?}: {denied}");
        let relative = run_in(&mode, &["bin/true"], &[]).await.unwrap_err();
        assert!(relative.contains("not an absolute path"), "{mode:?}: {relative}");
        // And the next start is not disturbed by the failures.
        let ok = run_in(&mode, &["/bin/true"], &[]).await.unwrap();
        assert_eq!(ok.exit_code, Some(0), "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_run_cgroup_is_reused_and_one_left_busy_is_not() {
    let Some(mode) = modes().into_iter().find(|m| matches!(m, Containment::Cgroup { .. })) else {
        return; // no cgroup mode on this machine (not root): nothing to test
    };
    let cgroup_of = |out: sonde_sandbox::host::exec::ProgramOutput| {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or_else(|| panic!("{text}"))
            .to_owned()
    };
    let cat = ["/bin/cat", "/proc/self/cgroup"];
    let first = cgroup_of(run_in(&mode, &cat, &[]).await.unwrap());
    let second = cgroup_of(run_in(&mode, &cat, &[]).await.unwrap());
    assert_eq!(first, second, "an empty cgroup was not reused");
    // A run that leaves a process behind: its cgroup is killed and
    // removed, never handed to the next run with the process in it.
    let dir = tempfile::tempdir().unwrap();
    let script = format!("cat /proc/self/cgroup; {}", escaping_script(dir.path(), "exit 0"));
    let busy = cgroup_of(run_in(&mode, &["/bin/sh", "-c", &script], &[]).await.unwrap());
    let next = cgroup_of(run_in(&mode, &cat, &[]).await.unwrap());
    assert_ne!(busy, next, "a cgroup with an escapee in it was reused");
    let survivors: Vec<i32> = pids_in(dir.path()).into_iter().filter(|&p| alive(p)).collect();
    assert_eq!(survivors, Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_runs_keeps_no_more_idle_cgroups_than_its_bound() {
    use sonde_sandbox::host::contain::IDLE_RUN_CGROUPS;
    let Some(Containment::Cgroup { parent, .. }) =
        modes().into_iter().find(|m| matches!(m, Containment::Cgroup { .. }))
    else {
        return; // no cgroup mode on this machine (not root): nothing to test
    };
    // A parent of its own, so that no other test's runs count.
    let burst = parent.join("burst");
    std::fs::create_dir(&burst).unwrap();
    let mode = Containment::Cgroup {
        parent: burst.clone(),
        limits: Vec::new(),
    };
    // Three times the bound at once: each run needs a cgroup of its own.
    let runs = (0..3 * IDLE_RUN_CGROUPS).map(|_| run_in(&mode, &["/bin/sleep", "0.2"], &[]));
    for out in futures_util::future::join_all(runs).await {
        assert_eq!(out.unwrap().exit_code, Some(0));
    }
    let left: Vec<_> = std::fs::read_dir(&burst)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("run-")))
        .collect();
    for run in &left {
        let _ = std::fs::remove_dir(run);
    }
    let _ = std::fs::remove_dir(&burst);
    assert!(left.len() <= IDLE_RUN_CGROUPS, "{} run cgroups left", left.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_midway_leaves_nothing_behind() {
    for mode in modes() {
        let dir = tempfile::tempdir().unwrap();
        let argv = sh(escaping_script(dir.path(), "sleep 1000"));
        let run = run_contained(&argv, &[], Duration::from_secs(600), &mode, RunLimits::default());
        // Dropped (as a call cut off at its deadline is) once both escapees
        // have recorded themselves.
        let recorded = async {
            while pids_in(dir.path()).len() < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            out = run => panic!("{mode:?}: the run ended by itself: {out:?}"),
            () = recorded => {}
        }
        let pids = pids_in(dir.path());
        let deadline = Instant::now() + Duration::from_secs(20);
        while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let survivors: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
        assert_eq!(
            survivors,
            Vec::<i32>::new(),
            "{}: outlived the dropped call",
            mode.describe()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_runs_at_once_each_get_their_own_output_and_status() {
    for mode in modes() {
        let runs = (0..32).map(|i| {
            let mode = mode.clone();
            async move {
                let script = format!("echo out-{i}; echo err-{i} >&2; exit {}", i % 7);
                (i, run_in(&mode, &["/bin/sh", "-c", &script], &[]).await.unwrap())
            }
        });
        for (i, out) in futures_util::future::join_all(runs).await {
            assert_eq!(out.exit_code, Some(i % 7), "{mode:?}: run {i}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), format!("out-{i}\n"), "{mode:?}");
            assert_eq!(String::from_utf8_lossy(&out.stderr), format!("err-{i}\n"), "{mode:?}");
        }
        // A program a signal ends has no exit code (its supervisor, if it
        // has one, ends the same way), and did not time out.
        for signal in ["KILL", "TERM", "SEGV"] {
            let script = format!("kill -{signal} $$");
            let out = run_in(&mode, &["/bin/sh", "-c", &script], &[]).await.unwrap();
            assert_eq!((out.exit_code, out.timed_out), (None, false), "{mode:?}: SIG{signal}");
        }
    }
}

fn sh(script: String) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_program_leaves_behind_dies_when_it_exits() {
    for mode in modes() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        // The escapees hold stdout: without containment the call would
        // wait for them (1000 s) whatever the timeout.
        let out = run_contained(
            &sh(escaping_script(dir.path(), "exit 3")),
            &[],
            Duration::from_secs(60),
            &mode,
            RunLimits::default(),
        )
        .await
        .unwrap();
        let took = started.elapsed();
        assert_eq!((out.exit_code, out.timed_out), (Some(3), false), "{mode:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{mode:?}");
        assert!(took < Duration::from_secs(30), "{mode:?}: returned after {took:?}");
        let pids = pids_in(dir.path());
        assert_eq!(pids.len(), 2, "{mode:?}");
        let survivors: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
        assert_eq!(survivors, Vec::<i32>::new(), "{}: escaped the run", mode.describe());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_program_and_its_escapees_end_at_the_timeout() {
    for mode in modes() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(500);
        let started = Instant::now();
        let out = run_contained(
            &sh(escaping_script(dir.path(), "sleep 1000")),
            &[],
            timeout,
            &mode,
            RunLimits::default(),
        )
        .await
        .unwrap();
        let took = started.elapsed();
        assert!(out.timed_out, "{mode:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{mode:?}");
        assert!(took >= timeout, "{mode:?}: {took:?}");
        // Generous: only a run that waits for its escapees takes longer.
        assert!(took < Duration::from_secs(20), "{mode:?}: returned after {took:?}");
        let survivors: Vec<i32> = pids_in(dir.path()).into_iter().filter(|&p| alive(p)).collect();
        assert_eq!(survivors, Vec::<i32>::new(), "{}: escaped the run", mode.describe());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_running_a_granted_shell_cannot_leave_anything_behind() {
    let dir = tempfile::tempdir().unwrap();
    let grants = Grants {
        exec: vec!["/bin/sh".into()],
        ..Grants::default()
    };
    let command = sh(escaping_script(dir.path(), "exit 0"));
    let config = serde_json::json!({"command": command, "mode": "exit-code"}).to_string();
    let r = run(&builtin("exec").await, "", &config, &grants, Duration::from_secs(30)).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.duration < Duration::from_secs(20), "{r:?}");
    let pids = pids_in(dir.path());
    assert_eq!(pids.len(), 2);
    let survivors: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    assert_eq!(
        survivors,
        Vec::<i32>::new(),
        "{}: escaped the run",
        Containment::in_force().describe()
    );
}

#[test]
fn the_agent_keeps_no_token_in_its_environment_and_says_how_it_contains() {
    const SECRET: &str = "tok-3f9a1c0d5e7b2468-secret";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        "operator_token_env: SONDE_TEST_OPERATOR_TOKEN\ntargets:\n  - name: web\n    address: 127.0.0.1:9\n    probes:\n      - {name: web-port, kind: readiness, plugin: tcp, period: 10s}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["run", "--api", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .env("SONDE_TEST_OPERATOR_TOKEN", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let mut start = None;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("sonde started") {
            start = Some(line);
            break;
        }
    }
    let environ = std::fs::read(format!("/proc/{}/environ", child.id()));
    let _ = child.kill();
    let _ = child.wait();
    let start = start.unwrap_or_else(|| panic!("no start line:\n{}", seen.join("\n")));
    assert!(start.contains("exec_containment="), "{start}");
    let environ = String::from_utf8_lossy(&environ.unwrap()).into_owned();
    assert!(!environ.contains(SECRET), "the token is in /proc/<pid>/environ");
}

/// A `files` grant holding a FIFO nobody writes to, a symlink to an
/// absolute path, one out of the grant, and a file outside it.
fn files_grant() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let grant = tmp.path().join("grant");
    std::fs::create_dir(&grant).unwrap();
    std::fs::write(grant.join("ok"), "fine").unwrap();
    std::fs::write(tmp.path().join("secret"), "outside").unwrap();
    std::os::unix::fs::symlink("../secret", grant.join("up")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", grant.join("abs")).unwrap();
    let fifo = std::ffi::CString::new(grant.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: a plain system call on a valid C string.
    #[allow(unsafe_code, reason = "mkfifo, to make a FIFO the test grants")]
    let made = unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
    assert_eq!(made, 0, "mkfifo");
    (tmp, grant)
}

fn files(grant: &Path) -> Grants {
    Grants {
        files: vec![grant.to_path_buf()],
        ..Grants::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_a_files_grant_is_refused_not_waited_on() {
    use sonde_sandbox::verdict::Reason;
    let (_tmp, grant) = files_grant();
    let plugin = crate::support::guest(sonde_tests::guests::OPEN_FIFO).await;
    // Many times over: each would keep a host thread blocked for good.
    for _ in 0..20 {
        let config = serde_json::json!([grant.join("fifo")]).to_string();
        let r = run(&plugin, "", &config, &files(&grant), Duration::from_secs(5)).await;
        assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
        assert!(r.message.contains("a FIFO"), "{}", r.message);
        assert!(r.duration < Duration::from_secs(4), "waited on the FIFO: {r:?}");
    }
    // A regular file in the same grant still reads.
    let config = serde_json::json!([grant.join("ok")]).to_string();
    let r = run(&plugin, "", &config, &files(&grant), Duration::from_secs(5)).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.contains("Ok(4)"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaping_a_files_grant_is_denied() {
    use sonde_sandbox::verdict::Reason;
    let (_tmp, grant) = files_grant();
    let plugin = crate::support::guest(sonde_tests::guests::ESCAPE_FILES_GRANT).await;
    let dotdot = format!("{}/../secret", grant.display());
    for path in [
        grant.join("up").display().to_string(),
        grant.join("abs").display().to_string(),
        dotdot,
    ] {
        let config = serde_json::json!([path]).to_string();
        let r = run(&plugin, "", &config, &files(&grant), Duration::from_secs(5)).await;
        assert_eq!(
            (r.status, r.reason),
            (Status::Unknown, Some(Reason::Denied)),
            "{path}: {r:?}"
        );
        assert!(r.message.contains("leads outside the files grant"), "{}", r.message);
        assert!(!r.message.contains("outside\")"), "read the secret: {}", r.message);
    }
    let config = serde_json::json!([grant.join("ok")]).to_string();
    let r = run(&plugin, "", &config, &files(&grant), Duration::from_secs(5)).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.contains("Ok(\"fine\")"), "{}", r.message);
}

/// `GET path` on the agent's API: the status code.
fn get_status(api: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let addr = api.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// A resolver that never answers — a UDP socket on `ip`:53 nobody reads —
/// and a `sonde` command that sees it as its only name server (a
/// resolv.conf bind-mounted in a mount namespace of its own): the socket,
/// to keep, and the command.
fn sonde_with_silent_resolver(dir: &Path, ip: &str) -> (std::net::UdpSocket, Command) {
    let resolver = std::net::UdpSocket::bind((ip, 53)).expect("bind the silent resolver");
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {ip}\noptions timeout:30 attempts:2\n")).unwrap();
    (resolver, sonde_with_mounts(&[(&resolv, "/etc/resolv.conf")]))
}

/// `sonde run` on `config` behind [`sonde_with_silent_resolver`] on `ip`:
/// the resolver (to keep), the agent, the rest of its stderr (kept open)
/// and its API address, read from its start line.
pub(crate) fn agent_with_silent_resolver(
    dir: &Path,
    ip: &str,
    config: &Path,
) -> (
    std::net::UdpSocket,
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStderr>>,
    String,
) {
    let (resolver, mut command) = sonde_with_silent_resolver(dir, ip);
    let mut child = command
        .args(["run", "--api", "127.0.0.1:0", "--no-jitter", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let api = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("no start line:\n{}", seen.join("\n"));
        };
        seen.push(line.clone());
        if let Some(at) = line.find(" api=") {
            break line[at + 5..].split(' ').next().unwrap().to_string();
        }
    };
    (resolver, child, lines, api)
}

#[test]
fn lookups_hold_a_bounded_number_of_threads() {
    use sonde_sandbox::host::blocking::MAX_LOOKUPS_IN_FLIGHT;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            "health_timeout: 1s\ntargets:\n  - name: slow\n    address: slow.sonde-test:80\n    probes:\n      - {{name: flood, kind: readiness, plugin: {}, period: 1s, timeout: 3s}}\n",
            sonde_tests::guests::FLOOD_LOOKUPS
        ),
    )
    .unwrap();
    let (resolver, mut child, _stderr, api) = agent_with_silent_resolver(dir.path(), "127.0.0.77", &config);
    // /livez notices once every lookup slot has been stuck for longer than
    // health_timeout…
    let waited = Instant::now();
    let mut livez = get_status(&api, "/livez");
    while livez == 200 && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        livez = get_status(&api, "/livez");
    }
    // …and the flood held no more threads than the lookup slots (plus the
    // agent's own: workers, the API, the epoch ticker).
    let threads = threads_of(child.id());
    let _ = child.kill();
    let _ = child.wait();
    drop(resolver);
    assert_eq!(livez, 503, "/livez never noticed the stuck lookups");
    assert!(
        threads < MAX_LOOKUPS_IN_FLIGHT + 40,
        "{threads} threads: blocked lookups are not bounded"
    );
}

#[test]
fn sonde_check_exits_with_its_answer_while_lookups_are_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let (resolver, mut command) = sonde_with_silent_resolver(dir.path(), "127.0.0.78");
    let started = Instant::now();
    let out = command
        .args([
            "check",
            sonde_tests::guests::FLOOD_LOOKUPS,
            "--target",
            "slow.sonde-test:80",
        ])
        .args(["--timeout", "2s", "-o", "json"])
        .output()
        .expect("unshare");
    let took = started.elapsed();
    drop(resolver);
    // The flood outlasts the call: a timeout, printed.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "timeout", "{v}");
    // The stuck lookups last a minute (2 attempts of 30 s); the command
    // waits for none of them.
    assert!(took < Duration::from_secs(25), "sonde check took {took:?}");
}

/// `GET path` on the agent's API: the whole response, as text.
pub(crate) fn get_text(api: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let addr = api.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// issue 16, finding 4: `wasi:sockets` name lookups against a resolver
/// that never answers hold at most the agent's lookup slots (32 threads,
/// whatever the plugins start); once they are all stuck, `/livez` fails
/// and a call that waits for one until its deadline ends `unknown`,
/// reason `host-limit`, naming the bound.
#[test]
fn wasi_lookups_hold_a_bounded_number_of_threads_and_a_starved_call_is_host_limit() {
    use sonde_sandbox::host::blocking::MAX_LOOKUPS_IN_FLIGHT;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    let probes: String = (0..6)
        .map(|i| {
            format!(
                "      - {{name: flood{i}, kind: readiness, plugin: {}, config: {{wait: true}}, period: 1s, timeout: 2s}}\n",
                sonde_tests::guests::FLOOD_WASI_LOOKUPS
            )
        })
        .collect();
    std::fs::write(
        &config,
        format!("health_timeout: 1s\ntargets:\n  - name: slow\n    address: slow.sonde-test:80\n    probes:\n{probes}"),
    )
    .unwrap();
    let (resolver, mut child, _stderr, api) = agent_with_silent_resolver(dir.path(), "127.0.0.79", &config);
    // A run cut off waiting for a lookup slot is reported as such…
    let waited = Instant::now();
    let mut probes = get_text(&api, "/v1/probes");
    while !probes.contains("name-lookup slots") && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
        probes = get_text(&api, "/v1/probes");
    }
    // …while /livez says the sandbox is out of lookups…
    let livez = get_status(&api, "/livez");
    // …and the lookups held no more threads than the slots (plus the
    // agent's own: workers, the API, the epoch ticker).
    let threads = threads_of(child.id());
    let _ = child.kill();
    let _ = child.wait();
    drop(resolver);
    assert!(
        probes.contains(&format!(
            "cut off waiting for one of the agent's {MAX_LOOKUPS_IN_FLIGHT} name-lookup slots"
        )),
        "no run reported the starved lookups: {probes}"
    );
    assert!(probes.contains("host-limit"), "{probes}");
    assert_eq!(livez, 503, "/livez never noticed the stuck lookups");
    assert!(
        threads < MAX_LOOKUPS_IN_FLIGHT + 40,
        "{threads} threads: blocked lookups are not bounded"
    );
}
