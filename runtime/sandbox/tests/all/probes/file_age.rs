//! The file-age plugin against real files, through a read-only files grant.

use crate::support::{builtin, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use std::path::Path;
use std::time::{Duration, SystemTime};

async fn file_age(path: &Path, max_age: &str, files: Vec<std::path::PathBuf>) -> RunResult {
    let config = serde_json::json!({ "path": path, "max_age": max_age }).to_string();
    let grants = Grants {
        files,
        ..Grants::default()
    };
    run(&builtin("file-age").await, "", &config, &grants, Duration::from_secs(1)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_file_is_a_success_and_an_old_one_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodename");
    std::fs::write(&file, "node-1").unwrap();
    let granted = vec![dir.path().to_path_buf()];

    let r = file_age(&file, "5m", granted.clone()).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.metrics.iter().any(|m| m.name == "size_bytes" && m.value == 6.0),
        "{r:?}"
    );

    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    filetime::set_file_mtime(&file, filetime::FileTime::from_system_time(an_hour_ago)).unwrap();
    let r = file_age(&file, "5m", granted.clone()).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("was modified 1h"), "{}", r.message);
    assert!(r.message.ends_with("more than 5m"), "{}", r.message);
    let age = r.metrics.iter().find(|m| m.name == "age_seconds").unwrap().value;
    assert!((3600.0..3700.0).contains(&age), "{age}");

    // Within a larger max_age it is fresh again.
    let r = file_age(&file, "2h", granted).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_file_is_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("absent");
    let r = file_age(&file, "5m", vec![dir.path().to_path_buf()]).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.ends_with("does not exist"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_is_a_failure_and_a_relative_symlink_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let granted = vec![dir.path().to_path_buf()];
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let r = file_age(&sub, "5m", granted.clone()).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.ends_with("is not a regular file"), "{}", r.message);

    let file = sub.join("status");
    std::fs::write(&file, "ok").unwrap();
    let link = dir.path().join("current");
    std::os::unix::fs::symlink("sub/status", &link).unwrap();
    let r = file_age(&link, "5m", granted.clone()).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.metrics.iter().any(|m| m.name == "size_bytes" && m.value == 2.0),
        "{r:?}"
    );

    // An absolute symlink is refused even where it points inside the
    // grant: the host resolves every path beneath the granted directory.
    let absolute = dir.path().join("absolute");
    std::os::unix::fs::symlink(&file, &absolute).unwrap();
    let r = file_age(&absolute, "5m", granted).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_grant_the_read_is_denied() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodename");
    std::fs::write(&file, "node-1").unwrap();
    let r = file_age(&file, "5m", vec![]).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");

    // A grant of another directory does not reach it either: outside every
    // preopened directory the file does not exist for the plugin.
    let other = tempfile::tempdir().unwrap();
    let r = file_age(&file, "5m", vec![other.path().to_path_buf()]).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.ends_with("does not exist"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_duration_is_invalid_config_naming_it() {
    let r = file_age(Path::new("/x"), "soon", vec![]).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
    assert!(r.message.contains("max_age \"soon\""), "{}", r.message);
}
