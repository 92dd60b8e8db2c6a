//! Plugins and probes that tenants add through the API (`PUT /v1/plugins/
//! {name}`, `PUT /v1/probes/{name}`), kept in `state_dir/managed/` so they
//! survive a restart:
//!
//! ```text
//! state_dir/managed/plugins/<tenant>/<name>.wasm
//! state_dir/managed/probes/<tenant>/<name>.json
//! ```
//!
//! Every write goes to a temporary file in the same directory, is synced,
//! then renamed over the old one: a crash leaves the old version or the
//! new one, never half of either. A crash mid-write leaves the temporary
//! file (`.sonde-tmp-…`); [`Store::open`] removes those. A batch of probes
//! (`PUT /v1/probes`) is first written whole to one journal file
//! (`probes.batch.json`, by the same atomic rename), then applied file by
//! file, then the journal is removed: a crash before the journal is in
//! place stores none of the batch, one after it stores all of it
//! ([`Store::open`] finishes what the journal holds). Names are checked
//! before they become paths. Nothing here decides whether an upload is
//! acceptable; the agent validates first and stores after.

use crate::config;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The largest plugin a tenant may upload: the largest plugin file.
pub const MAX_PLUGIN_BYTES: usize = sonde_policy::identity::MAX_PLUGIN_BYTES as usize;
/// The largest probe spec a tenant may upload.
pub const MAX_PROBE_BYTES: usize = 64 * 1024;
/// The largest batch of probe specs (`PUT /v1/probes`).
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// The most probes in one batch.
pub const MAX_BATCH_PROBES: usize = 10_000;

/// One probe of a batch's journal.
#[derive(serde::Serialize, serde::Deserialize)]
struct JournalEntry {
    tenant: String,
    name: String,
    spec: serde_json::Value,
}

/// One probe a tenant added.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredProbe {
    /// Its tenant.
    pub tenant: String,
    /// Its name (agent-wide unique).
    pub name: String,
    /// Its spec, as accepted.
    pub spec: serde_json::Value,
}

/// The store in `state_dir/managed`.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

/// Whether `name` can be a file name here: the config's name rule, and
/// not `.` or `..`.
pub fn valid_name(name: &str) -> bool {
    crate::catalog::valid_name(name) && name != "." && name != ".."
}

fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// The prefix of the temporary files writes go through.
const TMP_PREFIX: &str = ".sonde-tmp-";
/// The journal of the batch being stored, in the store's directory.
const BATCH_JOURNAL: &str = "probes.batch.json";

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    private_dir(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(TMP_PREFIX).tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

fn remove(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// `(tenant, name)` of every `<tenant>/<name>.<ext>` under `dir`.
fn entries(dir: &Path, ext: &str) -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(tenants) = std::fs::read_dir(dir) else {
        return out;
    };
    for t in tenants.flatten() {
        let tenant = t.file_name().to_string_lossy().to_string();
        let Ok(files) = std::fs::read_dir(t.path()) else {
            continue;
        };
        for f in files.flatten() {
            let file = f.file_name().to_string_lossy().to_string();
            if let Some(name) = file.strip_suffix(ext).and_then(|n| n.strip_suffix('.'))
                && valid_name(name)
                && valid_name(&tenant)
            {
                out.push((tenant.clone(), name.to_string(), f.path()));
            }
        }
    }
    out.sort();
    out
}

impl Store {
    /// The store under `state_dir` (created on first write).
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("managed"),
        }
    }

    /// The store under `state_dir`, as the agent opens it at start: the
    /// temporary files a crash left are removed, and a batch whose journal
    /// is in place is stored whole.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        let store = Self::new(state_dir);
        store.remove_stale_temporaries();
        let journal = store.dir.join(BATCH_JOURNAL);
        match std::fs::read(&journal) {
            Ok(bytes) => {
                let batch: Vec<StoredProbe> = serde_json::from_slice::<Vec<JournalEntry>>(&bytes)
                    .map_err(std::io::Error::other)?
                    .into_iter()
                    .map(|e| StoredProbe {
                        tenant: e.tenant,
                        name: e.name,
                        spec: e.spec,
                    })
                    .collect();
                tracing::info!(
                    probes = batch.len(),
                    "finishing a batch of probes interrupted by a crash"
                );
                store.apply_batch(&batch)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(store)
    }

    /// Removes the temporary files a write interrupted by a crash left
    /// (only this store's own, by their prefix; tempfile's default `.tmp`
    /// prefix, which earlier versions used, too).
    fn remove_stale_temporaries(&self) {
        let dirs = [self.dir.clone(), self.dir.join("plugins"), self.dir.join("probes")];
        let mut all: Vec<PathBuf> = dirs.to_vec();
        for d in &dirs[1..] {
            if let Ok(rd) = std::fs::read_dir(d) {
                all.extend(rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
            }
        }
        for dir in all {
            let Ok(rd) = std::fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if (name.starts_with(TMP_PREFIX) || name.starts_with(".tmp"))
                    && e.file_type().is_ok_and(|t| t.is_file())
                {
                    match std::fs::remove_file(e.path()) {
                        Ok(()) => {
                            tracing::info!(file = %e.path().display(), "removed a temporary file left by a crash")
                        }
                        Err(err) => {
                            tracing::warn!(file = %e.path().display(), error = %err, "cannot remove a temporary file left by a crash")
                        }
                    }
                }
            }
        }
    }

    /// Stores a batch of probes, all or none across a crash: the batch is
    /// written whole to the journal first, then each probe, then the
    /// journal is removed. On an error part way, what was there before is
    /// put back.
    pub fn put_probes(&self, batch: &[StoredProbe]) -> std::io::Result<()> {
        let entries: Vec<JournalEntry> = batch
            .iter()
            .map(|p| JournalEntry {
                tenant: p.tenant.clone(),
                name: p.name.clone(),
                spec: p.spec.clone(),
            })
            .collect();
        let journal = serde_json::to_vec(&entries).map_err(std::io::Error::other)?;
        let before: Vec<Option<StoredProbe>> = batch.iter().map(|p| self.probe(&p.tenant, &p.name)).collect();
        write_atomically(&self.dir.join(BATCH_JOURNAL), &journal)?;
        if let Err(e) = self.apply_batch(batch) {
            for (p, old) in batch.iter().zip(&before) {
                let _ = match old {
                    Some(old) => self.put_probe(old),
                    None => self.delete_probe(&p.tenant, &p.name).map(|_| ()),
                };
            }
            let _ = remove(&self.dir.join(BATCH_JOURNAL));
            return Err(e);
        }
        Ok(())
    }

    /// Writes each probe of a journalled batch, then removes the journal.
    fn apply_batch(&self, batch: &[StoredProbe]) -> std::io::Result<()> {
        for p in batch {
            if !valid_name(&p.tenant) || !valid_name(&p.name) {
                return Err(std::io::Error::other(format!(
                    "the batch journal names {:?}/{:?}, which is not a name",
                    p.tenant, p.name
                )));
            }
            self.put_probe(p)?;
        }
        remove(&self.dir.join(BATCH_JOURNAL))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// Where tenant `tenant`'s plugin `name` is kept.
    pub fn plugin_path(&self, tenant: &str, name: &str) -> PathBuf {
        self.dir.join("plugins").join(tenant).join(format!("{name}.wasm"))
    }

    fn probe_path(&self, tenant: &str, name: &str) -> PathBuf {
        self.dir.join("probes").join(tenant).join(format!("{name}.json"))
    }

    /// Every stored plugin: `(tenant, name, path)`.
    pub fn plugins(&self) -> Vec<(String, String, PathBuf)> {
        entries(&self.dir.join("plugins"), "wasm")
    }

    /// Which tenant has a plugin called `name`.
    pub fn plugin_owner(&self, name: &str) -> Option<String> {
        self.plugins().into_iter().find(|(_, n, _)| n == name).map(|(t, ..)| t)
    }

    /// The stored probe `name` of `tenant`, if there is one.
    pub fn probe(&self, tenant: &str, name: &str) -> Option<StoredProbe> {
        let bytes = std::fs::read(self.probe_path(tenant, name)).ok()?;
        let spec = serde_json::from_slice(&bytes).ok()?;
        Some(StoredProbe {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
        })
    }

    /// Every stored probe; an unreadable file is logged and skipped.
    pub fn probes(&self) -> Vec<StoredProbe> {
        entries(&self.dir.join("probes"), "json")
            .into_iter()
            .filter_map(|(tenant, name, path)| {
                let parsed = std::fs::read(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
                match parsed {
                    Ok(spec) => Some(StoredProbe { tenant, name, spec }),
                    Err(e) => {
                        tracing::error!(file = %path.display(), error = %e, "a stored probe cannot be read; skipped");
                        None
                    }
                }
            })
            .collect()
    }

    /// Stores a plugin and its signature (a sigstore bundle, kept beside
    /// it as `NAME.wasm.sigstore.json`, where the catalog's check of a
    /// plugin file finds it); a plugin stored without one loses the old.
    pub fn put_plugin(&self, tenant: &str, name: &str, wasm: &[u8], signature: Option<&[u8]>) -> std::io::Result<()> {
        let path = self.plugin_path(tenant, name);
        let bundle = sonde_oci::signing::bundle_path(&path);
        // The old signature goes first: never new bytes beside it.
        remove(&bundle)?;
        write_atomically(&path, wasm)?;
        match signature {
            Some(sig) => write_atomically(&bundle, sig),
            None => Ok(()),
        }
    }

    /// Removes a plugin (and its signature); whether it was there.
    pub fn delete_plugin(&self, tenant: &str, name: &str) -> std::io::Result<bool> {
        let path = self.plugin_path(tenant, name);
        remove(&sonde_oci::signing::bundle_path(&path))?;
        remove(&path)
    }

    /// Stores a probe.
    pub fn put_probe(&self, probe: &StoredProbe) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&probe.spec).map_err(std::io::Error::other)?;
        write_atomically(&self.probe_path(&probe.tenant, &probe.name), &bytes)
    }

    /// Removes a probe; whether it was there.
    pub fn delete_probe(&self, tenant: &str, name: &str) -> std::io::Result<bool> {
        remove(&self.probe_path(tenant, name))
    }
}

/// Why a probe spec from the API cannot become a config target.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not YAML or JSON.
    #[error("the body is not YAML or JSON: {0}")]
    Syntax(String),
    /// Not a mapping.
    #[error("the body must be a mapping with address, plugin and the probe's keys")]
    NotAMapping,
    /// A key the API sets itself.
    #[error("{0}: set by the API (the name comes from the URL, the tenant from the token)")]
    Reserved(&'static str),
    /// No address.
    #[error("address: missing (host:port or URL of what the probe checks)")]
    NoAddress,
    /// A plugin given as a file path.
    #[error(
        "plugin: {0:?}: a tenant's probe names a built-in or a plugin uploaded with PUT /v1/plugins/NAME, not a path"
    )]
    PluginPath(String),
    /// An invalid config.
    #[error("{0}")]
    Config(config::ConfigErrors),
    /// A batch that is not a list.
    #[error("the body must be a list of probe specs, each with its name")]
    NotAList,
    /// A batch item without a name.
    #[error("item {0}: name: missing (each probe of a batch names itself)")]
    NoName(usize),
    /// A batch naming one probe twice.
    #[error("probe {0:?} is in the batch twice")]
    Twice(String),
    /// A batch over the count limit.
    #[error("{0} probes in one batch; at most {MAX_BATCH_PROBES}")]
    TooMany(usize),
    /// A batch item that is not a valid spec.
    #[error("probe {0:?}: {1}")]
    Item(String, Box<SpecError>),
}

/// Parses a probe spec (YAML or JSON) as the API receives it.
pub fn parse_spec(body: &[u8]) -> Result<serde_json::Value, SpecError> {
    let text = std::str::from_utf8(body).map_err(|e| SpecError::Syntax(e.to_string()))?;
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| SpecError::Syntax(e.to_string()))?;
    check_spec(value)
}

/// Checks one probe spec's shape: a mapping with an `address`, no `name`
/// or `tenant` (the path and the token say those), and a plugin that is a
/// name, not a path.
fn check_spec(value: serde_json::Value) -> Result<serde_json::Value, SpecError> {
    let map = value.as_object().ok_or(SpecError::NotAMapping)?;
    for key in ["name", "tenant"] {
        if map.contains_key(key) {
            return Err(SpecError::Reserved(if key == "name" { "name" } else { "tenant" }));
        }
    }
    if !map.get("address").is_some_and(|a| a.is_string()) {
        return Err(SpecError::NoAddress);
    }
    match map.get("plugin").and_then(|p| p.as_str()) {
        Some(p) if crate::catalog::resolve::is_path(p) => return Err(SpecError::PluginPath(p.into())),
        _ => {}
    }
    Ok(value)
}

/// Reads a batch of probe specs (YAML or JSON): a list of mappings, each
/// with its `name` and otherwise as for [`parse_spec`]; names unique, at
/// most [`MAX_BATCH_PROBES`].
pub fn parse_batch(body: &[u8]) -> Result<Vec<(String, serde_json::Value)>, SpecError> {
    let text = std::str::from_utf8(body).map_err(|e| SpecError::Syntax(e.to_string()))?;
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| SpecError::Syntax(e.to_string()))?;
    let serde_json::Value::Array(items) = value else {
        return Err(SpecError::NotAList);
    };
    if items.len() > MAX_BATCH_PROBES {
        return Err(SpecError::TooMany(items.len()));
    }
    let mut out: Vec<(String, serde_json::Value)> = Vec::with_capacity(items.len());
    for (i, mut item) in items.into_iter().enumerate() {
        let name = item
            .as_object_mut()
            .and_then(|m| m.remove("name"))
            .and_then(|n| n.as_str().map(str::to_string))
            .ok_or(SpecError::NoName(i))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(SpecError::Twice(name));
        }
        let spec = check_spec(item).map_err(|e| SpecError::Item(name.clone(), Box::new(e)))?;
        out.push((name, spec));
    }
    Ok(out)
}

/// Turns a stored probe into the config target it stands for: a target
/// of its own, named like the probe, owned by its tenant. A plugin name
/// that is one of the tenant's uploads becomes that file's path. Errors
/// name `PUT /v1/probes/<name>`.
pub fn to_target(store: &Store, probe: &StoredProbe) -> Result<config::Target, SpecError> {
    let mut spec = probe.spec.clone();
    let map = spec.as_object_mut().ok_or(SpecError::NotAMapping)?;
    let address = map.remove("address").ok_or(SpecError::NoAddress)?;
    if let Some(plugin) = map.get("plugin").and_then(|p| p.as_str()) {
        let uploaded = store.plugin_path(&probe.tenant, plugin);
        if sonde_builtins::get(plugin).is_none() && valid_name(plugin) && uploaded.is_file() {
            map.insert("plugin".into(), uploaded.display().to_string().into());
        }
    }
    // The config text, one key of the spec per line (each value as
    // one-line JSON, which YAML reads), so a parse error's line says
    // which key it is about.
    let json = |v: &serde_json::Value| serde_json::to_string(v).unwrap_or_default();
    let mut text = format!("targets:\n  - name: {}\n", json(&probe.name.clone().into()));
    if probe.tenant != crate::tenants::DEFAULT_TENANT {
        text += &format!("    tenant: {}\n", json(&probe.tenant.clone().into()));
    }
    text += &format!(
        "    address: {}\n    probes:\n      - name: {}\n",
        json(&address),
        json(&probe.name.clone().into())
    );
    let first_key_line = text.lines().count() + 1;
    let keys: Vec<&String> = map.keys().collect();
    for (k, v) in map.iter() {
        text += &format!("        {}: {}\n", json(&k.clone().into()), json(v));
    }
    let source = PathBuf::from(format!("PUT /v1/probes/{}", probe.name));
    let mut parsed = config::parse(&source, &text).map_err(|mut e| {
        for err in &mut e.0 {
            let line = err.place.line as usize;
            let key = line.checked_sub(first_key_line).and_then(|i| keys.get(i));
            let message = err.message.clone();
            err.message = match key {
                Some(k) if !message.starts_with(k.as_str()) => format!("{k}: {message}"),
                _ => message,
            };
            err.place.line = 0;
            err.place.column = 0;
        }
        SpecError::Config(e)
    })?;
    let mut target = parsed.targets.pop().ok_or(SpecError::NotAMapping)?;
    target.source = Some(source);
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_the_directory_are_not_names() {
        for bad in ["", ".", "..", "a/b", "../x", "a b", "x\0"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name("shop-ready_2.v1"));
    }

    #[test]
    fn specs_are_checked_before_anything_is_stored() {
        assert!(matches!(parse_spec(b"[1, 2]"), Err(SpecError::NotAMapping)));
        assert!(matches!(parse_spec(b"plugin: tcp"), Err(SpecError::NoAddress)));
        assert!(matches!(
            parse_spec(b"address: a:1\nplugin: tcp\ntenant: other"),
            Err(SpecError::Reserved("tenant"))
        ));
        assert!(matches!(
            parse_spec(b"address: a:1\nplugin: /etc/evil.wasm"),
            Err(SpecError::PluginPath(_))
        ));
        let v = parse_spec(br#"{"address": "127.0.0.1:80", "plugin": "tcp"}"#).unwrap();
        assert_eq!(v["plugin"], "tcp");
    }

    #[test]
    fn writes_replace_whole_files_and_list_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let probe = StoredProbe {
            tenant: "acme".into(),
            name: "shop".into(),
            spec: serde_json::json!({"address": "127.0.0.1:80", "plugin": "tcp"}),
        };
        store.put_probe(&probe).unwrap();
        store.put_plugin("acme", "mine", b"\0asm", None).unwrap();
        assert_eq!(store.probes(), std::slice::from_ref(&probe));
        assert_eq!(store.plugin_owner("mine").as_deref(), Some("acme"));
        let target = to_target(&store, &probe).unwrap();
        assert_eq!(target.name.value, "shop");
        assert_eq!(target.tenant.as_ref().unwrap().value, "acme");
        assert_eq!(target.source.as_deref(), Some(Path::new("PUT /v1/probes/shop")));
        assert!(store.delete_probe("acme", "shop").unwrap());
        assert!(!store.delete_probe("acme", "shop").unwrap());
        assert!(store.probes().is_empty());
    }

    #[test]
    fn a_batch_journal_left_by_a_crash_is_finished_and_temporaries_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let probe = |name: &str, v: u32| StoredProbe {
            tenant: "acme".into(),
            name: name.into(),
            spec: serde_json::json!({"address": "127.0.0.1:80", "plugin": "tcp", "groups": [format!("v{v}")]}),
        };
        store.put_probes(&[probe("a", 1), probe("b", 1)]).unwrap();
        assert_eq!(store.probes(), vec![probe("a", 1), probe("b", 1)]);
        assert!(!dir.path().join("managed").join(BATCH_JOURNAL).exists());
        // A crash after the journal of a second batch was in place, after
        // its first probe was written, and in the middle of a plugin
        // upload (its temporary file).
        let entries: Vec<JournalEntry> = [probe("a", 2), probe("b", 2)]
            .into_iter()
            .map(|p| JournalEntry {
                tenant: p.tenant,
                name: p.name,
                spec: p.spec,
            })
            .collect();
        write_atomically(
            &dir.path().join("managed").join(BATCH_JOURNAL),
            &serde_json::to_vec(&entries).unwrap(),
        )
        .unwrap();
        store.put_probe(&probe("a", 2)).unwrap();
        let plugins = dir.path().join("managed/plugins/acme");
        private_dir(&plugins).unwrap();
        std::fs::write(plugins.join(".sonde-tmp-abc123"), b"\0asm half").unwrap();
        std::fs::write(plugins.join(".tmpXYZ"), b"\0asm half").unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.probes(), vec![probe("a", 2), probe("b", 2)]);
        assert!(!dir.path().join("managed").join(BATCH_JOURNAL).exists());
        assert_eq!(std::fs::read_dir(&plugins).unwrap().count(), 0);
    }
}
