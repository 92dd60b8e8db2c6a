//! The built-in exec plugin and the host's `exec` capability, with real
//! processes.

use crate::support::{builtin, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::{guests, live_processes_in_group};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECOND: Duration = Duration::from_secs(1);
const CHECK_DUMMY: &str = "/usr/lib/nagios/plugins/check_dummy";

fn grants(programs: &[&Path]) -> Grants {
    Grants {
        exec: programs.iter().map(|p| p.to_path_buf()).collect(),
        ..Grants::default()
    }
}

/// Runs the built-in exec plugin on `command` in `mode`.
async fn exec(command: &[&str], mode: &str, grants: &Grants, timeout: Duration) -> RunResult {
    let config = serde_json::json!({"command": command, "mode": mode}).to_string();
    run(&builtin("exec").await, "", &config, grants, timeout).await
}

/// Writes an executable shell script into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A script that records its pid (its process group's id), leaves a child
/// sleeping in the background and sleeps itself: (script, pid file).
fn hanging_script(dir: &Path) -> (PathBuf, PathBuf) {
    let pidfile = dir.join("pid");
    let body = format!("echo $$ > {}\nsleep 60 &\nsleep 60", pidfile.display());
    (script(dir, "hang", &body), pidfile)
}

fn group_of(pidfile: &Path) -> i32 {
    std::fs::read_to_string(pidfile).unwrap().trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nagios_mode_maps_check_dummy() {
    let dummy = grants(&[Path::new(CHECK_DUMMY)]);
    let cases = [
        ("0", Status::Success),
        ("1", Status::Warning),
        ("2", Status::Failure),
        ("3", Status::Unknown),
    ];
    for (code, status) in cases {
        let r = exec(&[CHECK_DUMMY, code, "hi"], "nagios", &dummy, SECOND).await;
        assert_eq!((r.status, r.reason), (status, None), "{r:?}");
        assert!(r.message.ends_with("hi"), "{}", r.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nagios_perfdata_becomes_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = script(
        dir.path(),
        "check_disk",
        "echo 'DISK OK | /=2643MB;5948;5958;0;5968 time=0.5s'",
    );
    let r = exec(&[plugin.to_str().unwrap()], "nagios", &grants(&[&plugin]), SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.message, "DISK OK");
    let metrics: Vec<_> = r
        .metrics
        .iter()
        .map(|m| (m.name.as_str(), m.value, m.unit.as_str()))
        .collect();
    assert_eq!(metrics, [("_", 2643.0, "MB"), ("time", 0.5, "s")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_mode() {
    let both = grants(&[Path::new("/bin/true"), Path::new("/bin/false")]);
    let r = exec(&["/bin/true"], "exit-code", &both, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = exec(&["/bin/false"], "exit-code", &both, SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("exited 1"), "{}", r.message);
}

/// The processes of group `pgid` still alive once it has had 5 s to die:
/// the kill is sent as the run ends, and on a busy machine the processes
/// may take a moment to be scheduled and exit. Returns at once when the
/// group is empty (the event), so a group that never dies fails in 5 s.
async fn group_gone(pgid: i32) -> Vec<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let live = live_processes_in_group(pgid);
        if live.is_empty() || std::time::Instant::now() > deadline {
            return live;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_check_and_its_children_are_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (hang, pidfile) = hanging_script(dir.path());
    let r = exec(
        &[hang.to_str().unwrap()],
        "exit-code",
        &grants(&[&hang]),
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.duration < 2 * SECOND, "{:?}", r.duration);
    assert_eq!(group_gone(group_of(&pidfile)).await, Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_deadline_kills_the_group_even_while_the_plugin_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (hang, pidfile) = hanging_script(dir.path());
    let config = serde_json::json!({"command": [hang]}).to_string();
    let plugin = guest(guests::EXEC_PAST_DEADLINE).await;
    let r = run(&plugin, "", &config, &grants(&[&hang]), Duration::from_millis(300)).await;
    assert_eq!((r.status, r.reason), (Status::Failure, Some(Reason::Timeout)), "{r:?}");
    assert_eq!(group_gone(group_of(&pidfile)).await, Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ungranted_program_is_denied_and_never_started() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let prog = script(dir.path(), "touch_marker", &format!("touch {}", marker.display()));
    let r = exec(&[prog.to_str().unwrap()], "exit-code", &Grants::default(), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(!marker.exists());
    // Another spelling of a granted path is not granted either.
    let r = exec(
        &["/bin/../bin/true"],
        "exit-code",
        &grants(&[Path::new("/bin/true")]),
        SECOND,
    )
    .await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_empty_unless_granted() {
    let mut env = grants(&[Path::new("/usr/bin/env")]);
    let r = exec(&["/usr/bin/env"], "exit-code", &env, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.detail, None, "the environment was not empty");
    env.env = vec![("PGHOST".into(), "db".into())];
    let r = exec(&["/usr/bin/env"], "exit-code", &env, SECOND).await;
    // Plugin text is data: the program's newline reaches the host escaped.
    assert_eq!(r.detail.as_deref(), Some("PGHOST=db\\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let chatty = script(dir.path(), "chatty", "head -c 10000000 /dev/zero");
    let r = exec(
        &[chatty.to_str().unwrap()],
        "exit-code",
        &grants(&[&chatty]),
        5 * SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.detail.unwrap().len() <= sonde_sandbox::host::exec::MAX_OUTPUT_BYTES);
}
