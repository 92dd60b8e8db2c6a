//! Containment of plugin work: exec'd programs die whole with their run
//! (in each containment mode this machine can run), and a files grant
//! holds what a plugin may open.

use crate::support::{builtin, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::host::contain::Containment;
use sonde_sandbox::host::contain::RunLimits;
use sonde_sandbox::host::exec::run_contained;
use sonde_sandbox::verdict::Status;
use std::path::Path;
use std::process::Command;
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
