//! The config's `modules:`, resolved: each module is a probe template
//! without a target, which `GET /probe?target=T&module=M` (`api::scrape`)
//! runs against the target a scraper asks for.
//!
//! A module goes through the registry's own steps as a probe does (the
//! plugin loaded and its signature checked, the config against the
//! plugin's schema, the grants parsed, the tenant's quotas and ceiling),
//! as a probe of a target named `modules.<name>` that is never committed:
//! it takes no name, runs on no schedule and shows in no `/v1/probes`. Its
//! errors name the file, line and key like any probe's, so `sonde
//! validate` refuses what `sonde run` would.

use super::{Catalog, Change, ProbeSpec};
use crate::config::{self, ConfigError, ConfigErrors};
use sonde_sandbox::engine::Engine;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The modules of the config in force, by name.
#[derive(Clone, Debug, Default)]
pub struct Modules(BTreeMap<String, Arc<ProbeSpec>>);

impl Modules {
    /// Module `name`, resolved as a probe whose address is a stand-in:
    /// each `/probe` run sets its own.
    pub fn get(&self, name: &str) -> Option<&Arc<ProbeSpec>> {
        self.0.get(name)
    }

    /// The modules' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// How many modules there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The name the catalog knows module `name`'s probe (and its stand-in
/// target) by, in its messages.
fn probe_name(name: &str) -> String {
    format!("modules.{name}")
}

/// An address inside net grant `grant` (`HOST:PORT` as written), for the
/// stand-in target the catalog checks the module with: the grant's own
/// host (a CIDR's network address, a name under a `*.` domain) and port.
fn stand_in_address(grant: &str) -> String {
    let grant = grant.trim();
    let (host, port) = match grant.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, p)) => (format!("[{h}]"), p.strip_prefix(':').unwrap_or("*")),
            None => (grant.to_string(), "*"),
        },
        None => match grant.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p),
            None => (grant.to_string(), "*"),
        },
    };
    let host = match host.as_str() {
        "*" => "0.0.0.0".to_string(),
        h if h.starts_with("*.") => format!("sonde-module.{}", &h[2..]),
        h => match h.strip_prefix('[') {
            // A CIDR's network address, in brackets for IPv6.
            Some(v6) => format!("[{}]", v6.trim_end_matches(']').split('/').next().unwrap_or(v6)),
            None => h.split('/').next().unwrap_or(h).to_string(),
        },
    };
    match port {
        "*" => host,
        p => format!("{host}:{p}"),
    }
}

/// Resolves `modules` (from the file at `path`) against `catalog`, the
/// catalog loaded from the same file: every error found, with its place.
/// A module whose `oci://` plugin cannot be had now is left out (logged),
/// as a probe's would be.
pub(crate) async fn resolve(
    catalog: &Catalog,
    engine: &Engine,
    path: &Path,
    modules: BTreeMap<String, config::Module>,
) -> Result<Modules, ConfigErrors> {
    let mut errors = Vec::new();
    let mut out = BTreeMap::new();
    for (name, m) in modules {
        let at = m.plugin.referenced;
        let error = |message: String| ConfigError {
            place: config::place(path, &at),
            message,
        };
        if !crate::catalog::valid_name(&name) {
            errors.push(error(format!(
                "modules: {name:?}: a module name is 1-128 letters, digits, `-`, `_` or `.`"
            )));
            continue;
        }
        let Some(first) = m.grants.net.first() else {
            errors.push(error(format!(
                "modules.{name}.grants.net: empty: a module probes only targets inside its net grant, so it needs at least one (such as \"127.0.0.1:*\")"
            )));
            continue;
        };
        let defined = m.plugin.defined;
        let spanned = |value: String| config::Spanned::new(value, at, defined);
        let address = spanned(stand_in_address(&first.value));
        let probe = config::Probe {
            name: Some(spanned(probe_name(&name))),
            kind: None,
            plugin: m.plugin,
            config: m.config,
            target: None,
            period: None,
            initial_delay: None,
            propagate: m.propagate,
            timeout: m.timeout,
            success_threshold: None,
            failure_threshold: None,
            grants: m.grants,
            limits: m.limits,
            groups: Vec::new(),
            labels: None,
        };
        let target = config::Target {
            name: spanned(probe_name(&name)),
            tenant: m.tenant,
            address,
            on_failure: None,
            probes: vec![probe],
            source: None,
            targetless: false,
        };
        match catalog.prepare(engine, Change::add(vec![target])).await {
            Err(e) => errors.extend(e.0),
            Ok(prepared) => match prepared.probes().next() {
                Some(spec) => {
                    out.insert(name, spec.clone());
                }
                None => tracing::warn!(module = name, "module left out: its plugin cannot be had now"),
            },
        }
    }
    if errors.is_empty() {
        Ok(Modules(out))
    } else {
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::stand_in_address;

    #[test]
    fn a_stand_in_address_is_inside_its_grant() {
        for (grant, address) in [
            ("127.0.0.1:*", "127.0.0.1"),
            ("10.0.0.0/8:443", "10.0.0.0:443"),
            ("[::1]:8080", "[::1]:8080"),
            ("[fd00::/8]:*", "[fd00::]"),
            ("*.example.com:443", "sonde-module.example.com:443"),
            ("*:*", "0.0.0.0"),
            ("db.internal:5432", "db.internal:5432"),
        ] {
            let pattern: sonde_sandbox::host::NetPattern = grant.parse().unwrap();
            assert_eq!(stand_in_address(grant), address, "{grant}");
            let target = sonde_sandbox::host::NetPattern::for_target(address).unwrap();
            assert!(target.within(&pattern), "{address} not within {grant}");
        }
    }
}
