//! The built-in exec plugin and the host's `exec` capability, with real
//! processes.

use crate::support::{builtin, guest, run};
use sonde_runtime::host::Grants;
use sonde_runtime::verdict::{Reason, Status};
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

fn config(command: &[&str], mode: &str) -> String {
    serde_json::json!({"command": command, "mode": mode}).to_string()
}

/// Writes an executable shell script into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nagios_mode_maps_check_dummy() {
    let exec = builtin("exec").await;
    let dummy = Path::new(CHECK_DUMMY);
    for (code, status) in [
        ("0", Status::Success),
        ("1", Status::Warning),
        ("2", Status::Failure),
        ("3", Status::Unknown),
    ] {
        let r = run(
            &exec,
            "",
            &config(&[CHECK_DUMMY, code, "hi"], "nagios"),
            &grants(&[dummy]),
            SECOND,
        )
        .await;
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
    let r = run(
        &builtin("exec").await,
        "",
        &config(&[plugin.to_str().unwrap()], "nagios"),
        &grants(&[&plugin]),
        SECOND,
    )
    .await;
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
    let exec = builtin("exec").await;
    let (t, f) = (Path::new("/bin/true"), Path::new("/bin/false"));
    let r = run(
        &exec,
        "",
        &config(&["/bin/true"], "exit-code"),
        &grants(&[t, f]),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = run(
        &exec,
        "",
        &config(&["/bin/false"], "exit-code"),
        &grants(&[t, f]),
        SECOND,
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("exited 1"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_check_and_its_children_are_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let hang = script(
        dir.path(),
        "hang",
        &format!("echo $$ > {}\nsleep 60 &\nsleep 60", pidfile.display()),
    );
    let r = run(
        &builtin("exec").await,
        "",
        &config(&[hang.to_str().unwrap()], "exit-code"),
        &grants(&[&hang]),
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.duration < 2 * SECOND, "{:?}", r.duration);
    let pgid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert_eq!(live_processes_in_group(pgid), Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_deadline_kills_the_group_even_while_the_plugin_waits() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let hang = script(
        dir.path(),
        "hang",
        &format!("echo $$ > {}\nsleep 60 &\nsleep 60", pidfile.display()),
    );
    let config = serde_json::json!({"command": [hang]}).to_string();
    let r = run(
        &guest(guests::EXEC_PAST_DEADLINE).await,
        "",
        &config,
        &grants(&[&hang]),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, Some(Reason::Timeout)), "{r:?}");
    let pgid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert_eq!(live_processes_in_group(pgid), Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ungranted_program_is_denied_and_never_started() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let prog = script(dir.path(), "touch_marker", &format!("touch {}", marker.display()));
    let r = run(
        &builtin("exec").await,
        "",
        &config(&[prog.to_str().unwrap()], "exit-code"),
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(!marker.exists());
    // A relative path or a different spelling of a granted one is not granted either.
    let r = run(
        &builtin("exec").await,
        "",
        &config(&["/bin/../bin/true"], "exit-code"),
        &grants(&[Path::new("/bin/true")]),
        SECOND,
    )
    .await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_empty_unless_granted() {
    let env = Path::new("/usr/bin/env");
    let exec = builtin("exec").await;
    let r = run(
        &exec,
        "",
        &config(&["/usr/bin/env"], "exit-code"),
        &grants(&[env]),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.detail, None, "the environment was not empty");
    let mut g = grants(&[env]);
    g.env = vec![("PGHOST".into(), "db".into())];
    let r = run(&exec, "", &config(&["/usr/bin/env"], "exit-code"), &g, SECOND).await;
    assert_eq!(r.detail.as_deref().map(str::trim), Some("PGHOST=db"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let chatty = script(dir.path(), "chatty", "head -c 10000000 /dev/zero");
    let r = run(
        &builtin("exec").await,
        "",
        &config(&[chatty.to_str().unwrap()], "exit-code"),
        &grants(&[&chatty]),
        5 * SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.detail.unwrap().len() <= sonde_runtime::host::exec::MAX_OUTPUT_BYTES);
}
