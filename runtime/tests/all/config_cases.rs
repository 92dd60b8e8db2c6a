//! Golden config cases: every `tests/cases/config/valid/*.yaml` loads into
//! the registry its `.expected` file describes, and every
//! `tests/cases/config/invalid/*.yaml` is refused with exactly the error
//! text of its `.expected` file (file:line:column: key: what). Each invalid
//! case names the rules it breaks in a `# rules:` line, and every refusal
//! rule of the registry ([`Problem`]) is named by some case.
//!
//! `SONDE_BLESS=1 cargo test -p sonde-runtime --test all config_cases`
//! rewrites the `.expected` files from what the registry says; review the
//! diff before committing it.

use crate::support::engine;
use sonde_runtime::registry::{Problem, Registry};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::{Path, PathBuf};

fn cases_dir() -> PathBuf {
    crate::support::repo().join("tests/cases/config")
}

/// The rule a problem stands for: one name per variant. The match is
/// exhaustive, so a new rule cannot be added without naming it here, and
/// then without a case that covers it.
fn rule(p: &Problem) -> &'static str {
    match p {
        Problem::Api(_) => "Api",
        Problem::ApiLimit(_) => "ApiLimit",
        Problem::SandboxLimit(_) => "SandboxLimit",
        Problem::HealthTimeoutTooShort => "HealthTimeoutTooShort",
        Problem::TrustKey(_) => "TrustKey",
        Problem::RequireSignedWithoutTrust => "RequireSignedWithoutTrust",
        Problem::TenantIdInvalid(_) => "TenantIdInvalid",
        Problem::TenantIdDefault => "TenantIdDefault",
        Problem::TenantIdDuplicate { .. } => "TenantIdDuplicate",
        Problem::Token { .. } => "Token",
        Problem::TokenShared { .. } => "TokenShared",
        Problem::Quota { .. } => "Quota",
        Problem::CeilingNet { .. } => "CeilingNet",
        Problem::CeilingPath { .. } => "CeilingPath",
        Problem::CeilingRegistry { .. } => "CeilingRegistry",
        Problem::OciTimeoutZero { .. } => "OciTimeoutZero",
        Problem::RegistryOutsideCeiling { .. } => "RegistryOutsideCeiling",
        Problem::NameInvalid(_) => "NameInvalid",
        Problem::TargetDuplicate { .. } => "TargetDuplicate",
        Problem::ProbeDuplicate { .. } => "ProbeDuplicate",
        Problem::Address { .. } => "Address",
        Problem::UnknownTenant { .. } => "UnknownTenant",
        Problem::ActionEmpty => "ActionEmpty",
        Problem::ActionProgram(_) => "ActionProgram",
        Problem::SecondStartup(_) => "SecondStartup",
        Problem::OverQuota { .. } => "OverQuota",
        Problem::SuccessThresholdZero => "SuccessThresholdZero",
        Problem::SuccessThresholdNotOne { .. } => "SuccessThresholdNotOne",
        Problem::FailureThresholdZero => "FailureThresholdZero",
        Problem::PeriodTooShort(_) => "PeriodTooShort",
        Problem::TimeoutZero => "TimeoutZero",
        Problem::MemoryOverMax(_) => "MemoryOverMax",
        Problem::GrantNet(_) => "GrantNet",
        Problem::GrantExec(_) => "GrantExec",
        Problem::GrantFiles(_) => "GrantFiles",
        Problem::GrantFilesPseudo { .. } => "GrantFilesPseudo",
        Problem::Ceiling { .. } => "Ceiling",
        Problem::Group(_) => "Group",
        Problem::Label { .. } => "Label",
        Problem::Plugin(_) => "Plugin",
        Problem::Schema { .. } => "Schema",
        Problem::Ungranted { .. } => "Ungranted",
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
    "CeilingPath",
    "CeilingRegistry",
    "OciTimeoutZero",
    "RegistryOutsideCeiling",
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

/// What a loaded registry holds, one line a target, probe and warning.
fn describe(reg: &Registry) -> String {
    let mut out = String::new();
    let d = |d: std::time::Duration| humantime::format_duration(d).to_string();
    writeln!(
        out,
        "api {:?} state_dir {:?} health_timeout {:?} require_signed {}",
        reg.api.map(|a| a.to_string()),
        reg.state_dir
            .as_ref()
            .map(|p| p.file_name().unwrap_or_default().to_string_lossy().to_string()),
        reg.health_timeout.map(d),
        reg.require_signed
    )
    .unwrap();
    for t in reg.tenants.iter() {
        let q = &t.quotas;
        let c = t.ceiling.as_ref();
        writeln!(
            out,
            "tenant {} token {} max_probes {} max_concurrent_runs {} timeout {} fuel {} memory {} ceiling net {:?} exec {:?} files {:?}",
            t.id,
            t.token.is_some(),
            q.max_probes,
            q.max_concurrent_runs,
            d(q.timeout),
            q.fuel,
            q.memory,
            c.map(|c| c.net.iter().map(|n| n.to_string()).collect::<Vec<_>>()),
            c.map(|c| &c.exec),
            c.map(|c| &c.files),
        )
        .unwrap();
    }
    for t in reg.targets() {
        writeln!(
            out,
            "target {} tenant {} address {} on_failure {:?}",
            t.name, t.tenant, t.address, t.on_failure
        )
        .unwrap();
        for p in reg.probes_of(&t.name) {
            writeln!(
                out,
                "  probe {} {} plugin {} address {} config {} period {} initial_delay {} thresholds {}/{} timeout {} fuel {} memory {} net {:?} exec {:?} files {:?} env {:?} groups {:?} labels {:?}",
                p.name,
                p.kind,
                p.plugin_ref.rsplit('/').next().unwrap_or_default(),
                p.address,
                p.config,
                d(p.period),
                d(p.initial_delay),
                p.success_threshold,
                p.failure_threshold,
                d(p.limits.timeout),
                p.limits.fuel,
                p.limits.memory,
                p.grants.net.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                p.grants.exec,
                p.grants.files,
                p.grants.env,
                p.groups,
                p.labels,
            )
            .unwrap();
        }
    }
    for w in &reg.warnings {
        writeln!(out, "warning {w}").unwrap();
    }
    out
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
        let actual = match Registry::load_file(&engine(), &case).await {
            Ok(reg) => describe(&reg),
            Err(e) => format!("refused:\n{e}\n"),
        };
        failures.extend(check(&case, &actual.replace(&format!("{}/", dir.path().display()), "")));
    }
    for case in yamls(&dir.path().join("invalid")) {
        let text = std::fs::read_to_string(&case).unwrap();
        let rules = text
            .lines()
            .find_map(|l| l.strip_prefix("# rules:"))
            .unwrap_or_else(|| panic!("{}: no `# rules:` line", case.display()));
        named.extend(rules.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()));
        let actual = match Registry::load_file(&engine(), &case).await {
            Ok(_) => "loaded, but should have been refused\n".to_string(),
            Err(e) => format!("{e}\n"),
        };
        failures.extend(check(&case, &actual.replace(&format!("{}/", dir.path().display()), "")));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let all: BTreeSet<String> = RULES.iter().map(|r| r.to_string()).collect();
    let missing: Vec<&String> = all.difference(&named).collect();
    assert!(missing.is_empty(), "rules no invalid case names: {missing:?}");
    let unknown: Vec<&String> = named.difference(&all).collect();
    assert!(unknown.is_empty(), "cases name rules that do not exist: {unknown:?}");
    // `rule` names exactly RULES (less Parse): a variant added to Problem
    // fails to compile above until it is named, and then this list.
    let _ = rule;
}
