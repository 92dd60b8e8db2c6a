//! The postgres plugin as `sonde check` runs it: its exit codes. The
//! plugin's own contract is in sonde-sandbox's tests.

use crate::support::cache_dir;
use sonde_tests::{PgAuth, PostgresServer};
use std::process::Command;

fn sonde_check(server: &PostgresServer, password: &str) -> std::process::Output {
    let config = serde_json::json!({ "user": "postgres", "password": password }).to_string();
    Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["check", "postgres", "--timeout", "5s", "--target"])
        .arg(server.addr.to_string())
        .args(["--config", &config])
        .output()
        .expect("run sonde")
}

#[test]
fn cli_exit_codes_right_password_0_wrong_2_stopped_2() {
    let mut server = PostgresServer::start(PgAuth::Scram);
    let out = sonde_check(&server, PostgresServer::PASSWORD);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = sonde_check(&server, "wrong");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("password authentication failed"),
        "{out:?}"
    );
    server.stop();
    let out = sonde_check(&server, PostgresServer::PASSWORD);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
