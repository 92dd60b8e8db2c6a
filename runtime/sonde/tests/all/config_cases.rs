//! Golden config cases: every `tests/cases/config/valid/*.yaml` loads into
//! the registry its `.expected` file describes (the effective config, as
//! `sonde validate -o json` prints it, and the warnings), and every
//! `tests/cases/config/invalid/*.yaml` is refused with exactly the error
//! text of its `.expected` file (file:line:column: key: what). Each invalid
//! case names the rules it breaks in a `# rules:` line, and every refusal
//! rule of the registry ([`ConfigProblem`]) is named by some case.
//!
//! `SONDE_BLESS=1 cargo test -p sonde --test all config_cases`
//! rewrites the `.expected` files from what the registry says; review the
//! diff before committing it.

use crate::support::engine;
use sonde::cli::effective::effective;
use sonde_core::catalog::{Catalog, ConfigProblem};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::{Path, PathBuf};

fn cases_dir() -> PathBuf {
    crate::support::repo().join("tests/cases/config")
}

/// The rule a problem stands for: one name per variant. The match is
/// exhaustive, so a new rule cannot be added without naming it here, and
/// then without a case that covers it.
fn rule(p: &ConfigProblem) -> &'static str {
    match p {
        ConfigProblem::Api(_) => "Api",
        ConfigProblem::ApiLimit(_) => "ApiLimit",
        ConfigProblem::SandboxLimit(_) => "SandboxLimit",
        ConfigProblem::HealthTimeoutTooShort => "HealthTimeoutTooShort",
        ConfigProblem::TrustKey(_) => "TrustKey",
        ConfigProblem::RequireSignedWithoutTrust => "RequireSignedWithoutTrust",
        ConfigProblem::TenantIdInvalid(_) => "TenantIdInvalid",
        ConfigProblem::TenantIdDefault => "TenantIdDefault",
        ConfigProblem::TenantIdDuplicate { .. } => "TenantIdDuplicate",
        ConfigProblem::Token { .. } => "Token",
        ConfigProblem::TokenShared { .. } => "TokenShared",
        ConfigProblem::Quota { .. } => "Quota",
        ConfigProblem::CeilingNet { .. } => "CeilingNet",
        ConfigProblem::CeilingNodeIp { .. } => "CeilingNodeIp",
        ConfigProblem::CeilingPath { .. } => "CeilingPath",
        ConfigProblem::CeilingRegistry { .. } => "CeilingRegistry",
        ConfigProblem::TemplateName(_) => "TemplateName",
        ConfigProblem::TemplateCapZero => "TemplateCapZero",
        ConfigProblem::OciTimeoutZero { .. } => "OciTimeoutZero",
        ConfigProblem::OtlpProtocol(_) => "OtlpProtocol",
        ConfigProblem::OtlpEndpoint { .. } => "OtlpEndpoint",
        ConfigProblem::OtlpHeader { .. } => "OtlpHeader",
        ConfigProblem::OtlpFile { .. } => "OtlpFile",
        ConfigProblem::OtlpIdentityHalf => "OtlpIdentityHalf",
        ConfigProblem::OtlpInterval(_) => "OtlpInterval",
        ConfigProblem::OtlpTimeout { .. } => "OtlpTimeout",
        ConfigProblem::OtlpSuccessRatio(_) => "OtlpSuccessRatio",
        ConfigProblem::OtlpOutsideCeiling { .. } => "OtlpOutsideCeiling",
        ConfigProblem::RegistryOutsideCeiling { .. } => "RegistryOutsideCeiling",
        ConfigProblem::CeilingSigner { .. } => "CeilingSigner",
        ConfigProblem::SecretName { .. } => "SecretName",
        ConfigProblem::SecretSourceCount { .. } => "SecretSourceCount",
        ConfigProblem::SecretValue { .. } => "SecretValue",
        ConfigProblem::SecretNotOwned(_) => "SecretNotOwned",
        ConfigProblem::SecretExposed(_) => "SecretExposed",
        ConfigProblem::KeylessReserved => "KeylessReserved",
        ConfigProblem::TrustSignerDuplicate { .. } => "TrustSignerDuplicate",
        ConfigProblem::NameInvalid(_) => "NameInvalid",
        ConfigProblem::TargetDuplicate { .. } => "TargetDuplicate",
        ConfigProblem::ProbeDuplicate { .. } => "ProbeDuplicate",
        ConfigProblem::Address { .. } => "Address",
        ConfigProblem::UnknownTenant { .. } => "UnknownTenant",
        ConfigProblem::ActionEmpty => "ActionEmpty",
        ConfigProblem::ActionProgram(_) => "ActionProgram",
        ConfigProblem::SecondStartup(_) => "SecondStartup",
        ConfigProblem::OverQuota { .. } => "OverQuota",
        ConfigProblem::SuccessThresholdZero => "SuccessThresholdZero",
        ConfigProblem::SuccessThresholdNotOne { .. } => "SuccessThresholdNotOne",
        ConfigProblem::FailureThresholdZero => "FailureThresholdZero",
        ConfigProblem::PeriodTooShort(_) => "PeriodTooShort",
        ConfigProblem::TimeoutZero => "TimeoutZero",
        ConfigProblem::MemoryOverMax(_) => "MemoryOverMax",
        ConfigProblem::GrantNet(_) => "GrantNet",
        ConfigProblem::GrantIpProtocol(_) => "GrantIpProtocol",
        ConfigProblem::GrantExec(_) => "GrantExec",
        ConfigProblem::GrantFiles(_) => "GrantFiles",
        ConfigProblem::GrantFilesPseudo { .. } => "GrantFilesPseudo",
        ConfigProblem::Ceiling { .. } => "Ceiling",
        ConfigProblem::Group(_) => "Group",
        ConfigProblem::Label { .. } => "Label",
        ConfigProblem::Plugin(_) => "Plugin",
        ConfigProblem::Schema { .. } => "Schema",
        ConfigProblem::Ungranted { .. } => "Ungranted",
    }
}

/// Every rule, by way of [`rule`]'s match; parse errors (the file's shape)
/// are the `Parse` rule.
const RULES: &[&str] = &[
    "Parse",
    "Api",
    "ApiLimit",
    "SandboxLimit",
    "HealthTimeoutTooShort",
    "TrustKey",
    "RequireSignedWithoutTrust",
    "TenantIdInvalid",
    "TenantIdDefault",
    "TenantIdDuplicate",
    "Token",
    "TokenShared",
    "Quota",
    "CeilingNet",
    "CeilingNodeIp",
    "CeilingPath",
    "CeilingRegistry",
    "TemplateName",
    "TemplateCapZero",
    "OciTimeoutZero",
    "OtlpProtocol",
    "OtlpEndpoint",
    "OtlpHeader",
    "OtlpFile",
    "OtlpIdentityHalf",
    "OtlpInterval",
    "OtlpTimeout",
    "OtlpSuccessRatio",
    "OtlpOutsideCeiling",
    "RegistryOutsideCeiling",
    "CeilingSigner",
    "SecretName",
    "SecretSourceCount",
    "SecretValue",
    "SecretNotOwned",
    "SecretExposed",
    "KeylessReserved",
    "TrustSignerDuplicate",
    "NameInvalid",
    "TargetDuplicate",
    "ProbeDuplicate",
    "Address",
    "UnknownTenant",
    "ActionEmpty",
    "ActionProgram",
    "SecondStartup",
    "OverQuota",
    "SuccessThresholdZero",
    "SuccessThresholdNotOne",
    "FailureThresholdZero",
    "PeriodTooShort",
    "TimeoutZero",
    "MemoryOverMax",
    "GrantNet",
    "GrantIpProtocol",
    "GrantExec",
    "GrantFiles",
    "GrantFilesPseudo",
    "Ceiling",
    "Group",
    "Label",
    "Plugin",
    "Schema",
    "Ungranted",
];

/// A copy of the cases in a scratch directory, with token files private
/// (`*.token`, 0600) or deliberately not (`*.secret`, 0644) whatever
/// modes the checkout gave them.
fn scratch() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    for sub in ["valid", "invalid"] {
        let to = dir.path().join(sub);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(cases_dir().join(sub)).unwrap() {
            let from = e.unwrap().path();
            let dest = to.join(from.file_name().unwrap());
            std::fs::copy(&from, &dest).unwrap();
            let mode = match from.extension().and_then(|x| x.to_str()) {
                Some("token") => Some(0o600),
                Some("secret") => Some(0o644),
                _ => None,
            };
            if let Some(m) = mode {
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(m)).unwrap();
            }
        }
    }
    dir
}

fn yamls(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

/// What a loaded registry puts in force: its effective config, as
/// `sonde validate -o json` prints it, then one line a warning.
fn describe(reg: &Catalog) -> String {
    let mut out = serde_json::to_string_pretty(&effective(reg)).unwrap();
    out.push('\n');
    for w in &reg.warnings {
        writeln!(out, "warning {w}").unwrap();
    }
    out
}

/// `text` without the scratch directory and with the user's cache (the
/// default `oci.cache_dir` without a `state_dir`) as `<user cache>`.
fn normalise(text: &str, scratch: &Path) -> String {
    let user_cache = sonde_core::catalog::settings::oci_cache_dir(None);
    text.replace(&format!("{}/", scratch.display()), "")
        .replace(&user_cache.display().to_string(), "<user cache>/oci")
}

fn check(case: &Path, actual: &str) -> Option<String> {
    let expected_path = cases_dir()
        .join(case.parent().unwrap().file_name().unwrap())
        .join(case.with_extension("expected").file_name().unwrap());
    if std::env::var_os("SONDE_BLESS").is_some() {
        std::fs::write(&expected_path, actual).unwrap();
        return None;
    }
    let expected = std::fs::read_to_string(&expected_path)
        .unwrap_or_else(|e| panic!("{}: {e} (SONDE_BLESS=1 writes it)", expected_path.display()));
    (expected != actual).then(|| format!("{}:\n--- expected\n{expected}--- actual\n{actual}", case.display()))
}

#[tokio::test]
async fn config_cases() {
    let dir = scratch();
    let mut failures = Vec::new();
    let mut named: BTreeSet<String> = BTreeSet::new();
    for case in yamls(&dir.path().join("valid")) {
        let text = std::fs::read_to_string(&case).unwrap();
        if let Some(rules) = text.lines().find_map(|l| l.strip_prefix("# rules:")) {
            named.extend(rules.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()));
        }
        let actual = match Catalog::load_file(&engine(), &case).await {
            Ok(reg) => describe(&reg),
            Err(e) => format!("refused:\n{e}\n"),
        };
        failures.extend(check(&case, &normalise(&actual, dir.path())));
    }
    for case in yamls(&dir.path().join("invalid")) {
        let text = std::fs::read_to_string(&case).unwrap();
        let rules = text
            .lines()
            .find_map(|l| l.strip_prefix("# rules:"))
            .unwrap_or_else(|| panic!("{}: no `# rules:` line", case.display()));
        named.extend(rules.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()));
        let actual = match Catalog::load_file(&engine(), &case).await {
            Ok(_) => "loaded, but should have been refused\n".to_string(),
            Err(e) => format!("{e}\n"),
        };
        failures.extend(check(&case, &actual.replace(&format!("{}/", dir.path().display()), "")));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A secret read from the environment is removed from it (docs/secrets.md):
    // a case naming a variable the tests need (PATH) would take it from every
    // test in this process.
    assert!(
        std::env::var_os("PATH").is_some() && std::env::var_os("HOME").is_some(),
        "a case read PATH or HOME as a secret, which removed it from this test process: name a variable nothing else reads"
    );
    let all: BTreeSet<String> = RULES.iter().map(|r| r.to_string()).collect();
    let missing: Vec<&String> = all.difference(&named).collect();
    assert!(missing.is_empty(), "rules no invalid case names: {missing:?}");
    let unknown: Vec<&String> = named.difference(&all).collect();
    assert!(unknown.is_empty(), "cases name rules that do not exist: {unknown:?}");
    // `rule` names exactly RULES (less Parse): a variant added to ConfigProblem
    // fails to compile above until it is named, and then this list.
    let _ = rule;
}

/// The keys of `docs/config.md`'s tables (those whose first column is
/// `key`): each cell's backquoted names, `a` / `b` cells split, with the
/// table's prefix (`sandbox.`) where the names carry it.
fn documented_keys() -> Vec<String> {
    let text = std::fs::read_to_string(crate::support::repo().join("docs/config.md")).unwrap();
    let mut keys = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let first = line.split('|').nth(1).unwrap_or_default().trim();
        if first == "key" {
            in_table = true;
            continue;
        }
        if !in_table || first.starts_with("---") {
            continue;
        }
        for part in first.split('/') {
            if let Some(key) = part.trim().strip_prefix('`').and_then(|k| k.strip_suffix('`')) {
                keys.push(key.to_string());
            }
        }
    }
    keys
}

/// Every dotted path of object keys in `v` (array elements share their
/// array's path).
fn paths(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(path.clone());
                paths(v, &path, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| paths(v, prefix, out)),
        _ => {}
    }
}

/// issue 27: every key `docs/config.md` documents shows in the effective
/// config of some golden valid case, so a key parsed and then dropped
/// (the golden case sets it to a value other than its default) shows as a
/// diff there. A token is in force, never printed: `token_file` and
/// `token_env` (the operator's too) show as the tenant's `token`.
#[test]
fn every_documented_key_is_in_a_golden_case() {
    let mut seen = BTreeSet::new();
    for case in yamls(&cases_dir().join("valid")) {
        let expected = std::fs::read_to_string(case.with_extension("expected")).unwrap();
        let json = expected.split("\nwarning ").next().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{}: not JSON: {e}", case.display()));
        paths(&v, "", &mut seen);
    }
    let keys = documented_keys();
    assert!(keys.len() > 40, "the tables of docs/config.md were not found: {keys:?}");
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let effective = match k.as_str() {
                "token_file" | "token_env" => "token",
                "operator_token_file" | "operator_token_env" => "operator_token",
                other => other,
            };
            !seen
                .iter()
                .any(|p| p == effective || p.ends_with(&format!(".{effective}")))
        })
        .collect();
    assert!(missing.is_empty(), "documented keys no golden case shows: {missing:?}");
}

/// `sonde validate -o json` prints the effective config the golden case
/// holds.
#[test]
fn validate_prints_the_effective_config() {
    let dir = scratch();
    let case = dir.path().join("valid/full.yaml");
    let out = crate::support::sonde(&["validate", "-o", "json", case.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout)
        .unwrap()
        .replace(&format!("{}/", dir.path().display()), "");
    let expected = std::fs::read_to_string(cases_dir().join("valid/full.expected")).unwrap();
    let expected = expected.split("\nwarning ").next().unwrap().trim_end();
    assert_eq!(printed.trim_end(), expected);
}

/// issue 27: what `sonde run` refuses at start, `sonde validate` refuses
/// too, with the same message (one function decides for both): an API on
/// every address without a token, `--api-auth token` without a token, and
/// `--kubernetes` with a `kubernetes:` block that cannot work.
#[test]
fn validate_refuses_what_run_refuses_with_the_same_message() {
    let dir = tempfile::tempdir().unwrap();
    let target = "targets:\n  - name: web\n    address: 127.0.0.1:9\n    probes: [{plugin: tcp}]\n";
    let cases: [(&str, &[&str], &str); 5] = [
        (
            "api: 0.0.0.0:9464\n",
            &[],
            "the API on 0.0.0.0:9464 would answer anyone without a token",
        ),
        (
            "api: 127.0.0.1:0\n",
            &["--api-auth", "token"],
            "--api-auth token, but no token is configured",
        ),
        (
            "kubernetes: {node_name: n1, qps: 0}\n",
            &[],
            "kubernetes: qps and burst must be positive",
        ),
        (
            "kubernetes: {node_name: n1, message_refresh: 500ms}\n",
            &[],
            "kubernetes.message_refresh: 500ms is shorter than 1s",
        ),
        (
            "kubernetes: {node_name: n1, node_heartbeat: 5s}\n",
            &[],
            "kubernetes.node_heartbeat: 5s is shorter than 10s",
        ),
    ];
    for (i, (head, flags, refusal)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("case{i}.yaml"));
        std::fs::write(&path, format!("{head}{target}")).unwrap();
        let path = path.to_str().unwrap();
        let validate = crate::support::sonde(&[&["validate", path][..], flags].concat());
        let run = crate::support::sonde(&[&["run", "--no-jitter", "--config", path][..], flags].concat());
        for (what, out) in [("validate", &validate), ("run", &run)] {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what} {head}: {stderr}");
            assert!(stderr.contains(refusal), "{what} {head}: {stderr}");
        }
        let line = |out: &std::process::Output| {
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .find(|l| l.contains(refusal))
                .map(str::to_string)
        };
        assert_eq!(line(&validate), line(&run), "{head}: not the same message");
    }
}
