//! docs/secrets.md as users meet it: its config validates with the secret
//! file and variable in place, and its `sonde check --secret` line passes
//! against a server that wants the token.

use super::TOKEN;
use crate::support::{cache_dir, secret};
use std::process::Command;

fn doc() -> String {
    std::fs::read_to_string(crate::support::repo().join("docs/secrets.md")).unwrap()
}

#[test]
fn the_docs_config_validates_with_its_secrets_in_place() {
    let yaml = sonde_tests::doc_documents("docs/secrets.md", "# Secrets", "yaml").remove(0);
    let dir = tempfile::tempdir().unwrap();
    secret(dir.path(), "api-token", TOKEN);
    let yaml = yaml.replace("/run/secrets/api-token", dir.path().join("api-token").to_str().unwrap());
    let file = dir.path().join("sonde.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["validate"])
        .arg(&file)
        .env("DB_PASSWORD", "correct-horse-battery")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Without the variable, the secret is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["validate"])
        .arg(&file)
        .env_remove("DB_PASSWORD")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains("secrets.db-password: env DB_PASSWORD: not set in sonde's environment"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_sonde_check_line_passes_with_the_secret_and_fails_without() {
    let doc = doc();
    let line = doc
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap()
        .replace("\\\n", " ");
    assert!(line.contains("--secret api-token=/run/secrets/api-token"), "{line}");
    let server = super::token_server().await;
    let dir = tempfile::tempdir().unwrap();
    secret(dir.path(), "api-token", TOKEN);
    let args = |token_file: &str| {
        vec![
            "check".to_string(),
            "http".into(),
            "--target".into(),
            format!("http://{}/bearer", server.addr),
            "--config".into(),
            r#"{"bearer_token": "$(secret:api-token)"}"#.into(),
            "--secret".into(),
            format!("api-token={token_file}"),
        ]
    };
    let token = dir.path().join("api-token");
    let out = crate::support::sonde_async(args(token.to_str().unwrap())).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(TOKEN));
    secret(dir.path(), "api-token", "tok-wrong-wrong-wrong");
    let out = crate::support::sonde_async(args(token.to_str().unwrap())).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = crate::support::sonde_async(args(token.to_str().unwrap())).await;
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("--secret api-token: file") && text.contains("readable or writable by every user"),
        "{out:?}"
    );
}
