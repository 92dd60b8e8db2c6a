//! Reconciling one Pod, the pure part: from the Pod as the controller sees
//! it, the SondeChecks of its namespace, the probes already bound to it and
//! the gates already passed once, a [`PodPlan`] — which probes to remove,
//! which to add or replace (their config targets parsed), which gates have
//! no probe and why, and which Events to record. The controller's applier
//! performs it; nothing here touches the catalog or the API server.

use crate::crd::{Mode, SecretRef, SondeCheck};
use crate::desired::{Desired, Refusal, ServiceView, desired};
use crate::secrets::{Held, Problem};
use crate::settings::GateSettings;
use crate::view::{Cond, CondStatus, OVERRIDABLE, PodKey, PodView, condition_type};
use sonde_core::config::{self, ConfigErrors};
use sonde_core::thresholds::Counter;
use sonde_policy::secrets::SecretGrants;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// A probe the controller keeps for one gate of one Pod.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Binding {
    /// The Pod.
    pub(crate) pod: PodKey,
    /// The Pod's UID when the probe was added.
    pub(crate) uid: String,
    /// The SondeCheck the gate names.
    pub(crate) check: String,
    /// The config target it was added from.
    pub(crate) target: serde_json::Value,
    /// The check's mode.
    pub(crate) mode: Mode,
    /// The cells of the check's `secretRefs` it was given.
    pub(crate) secrets: SecretGrants,
}

/// A probe to add (or to put in place of the one of the same name).
#[derive(Debug)]
pub(crate) struct AddProbe {
    /// The probe's (and its target's) name.
    pub(crate) name: String,
    /// The SondeCheck the gate names.
    pub(crate) check: String,
    /// What the catalog is given, and what is bound once it is added.
    pub(crate) desired: Desired,
    /// The target as a config file would have it, parsed.
    pub(crate) target: config::Target,
    /// Whether a probe of this name (for this Pod UID) is replaced.
    pub(crate) replaces: bool,
    /// The state the condition already on the Pod seeds the probe with.
    pub(crate) seed: Counter,
    /// Whether its plugin is an `oci://` reference (a failure is retried
    /// when a pull ends).
    pub(crate) oci: bool,
    /// The cells of the check's `secretRefs` (the change's secrets).
    pub(crate) secrets: SecretGrants,
}

/// A gate whose probe's config target does not parse: refused like a
/// probe the catalog refuses.
#[derive(Debug)]
pub(crate) struct BadTarget {
    /// The probe's name.
    pub(crate) name: String,
    /// The SondeCheck the gate names.
    pub(crate) check: String,
    /// Whether a probe of this name is in the catalog (it goes).
    pub(crate) replaces: bool,
    /// What is wrong.
    pub(crate) errors: ConfigErrors,
}

/// What reconciling one Pod takes.
#[derive(Debug, Default)]
pub(crate) struct PodPlan {
    /// Probes to remove first: gates no longer wanted, or bound to an
    /// earlier Pod of the same name.
    pub(crate) remove: Vec<String>,
    /// Probes to add or replace.
    pub(crate) add: Vec<AddProbe>,
    /// Probes whose target does not parse.
    pub(crate) bad: Vec<BadTarget>,
    /// StartupOnly gates found True on the Pod: never checked again.
    pub(crate) started: Vec<String>,
    /// Gates with no probe, and why (their condition becomes
    /// `Unknown`/`CheckUnavailable` with that message).
    pub(crate) unavailable: Vec<(String, String)>,
    /// SondeChecks refused as such (an Event on each), with the message.
    pub(crate) refused_checks: Vec<(Arc<SondeCheck>, String)>,
    /// (Pod, gate) pairs refused (for the counter).
    pub(crate) refusals: u64,
    /// Override annotations a Pod may not set (an Event on the Pod each),
    /// with the message.
    pub(crate) unknown_overrides: Vec<(String, String)>,
    /// Each `secretRef` of the checks with a probe or held for one: the
    /// check, the reference's name, and what keeps it from use (an Event
    /// on the check when it changes), if anything.
    pub(crate) secret_notes: Vec<(Arc<SondeCheck>, String, Option<Problem>)>,
}

/// What [`plan_pod`] reads.
pub(crate) struct PodInputs<'a> {
    /// The Pod (absent: deleted).
    pub(crate) key: &'a PodKey,
    /// Its view, conditions as last written; `None` when it is gone.
    pub(crate) pod: Option<&'a PodView>,
    /// The SondeChecks by name in the Pod's namespace.
    pub(crate) checks: &'a dyn Fn(&str) -> Option<Arc<SondeCheck>>,
    /// The Services by name in the Pod's namespace.
    pub(crate) services: &'a dyn Fn(&str) -> Result<ServiceView, Refusal>,
    /// The agent's settings.
    pub(crate) settings: &'a GateSettings,
    /// Every probe the controller has in the catalog, by name.
    pub(crate) bindings: &'a HashMap<String, Binding>,
    /// Whether the StartupOnly gate on a check passed already, by (Pod UID, check).
    pub(crate) started: &'a dyn Fn(&str, &str) -> bool,
    /// A `secretRef` of a check of the Pod's namespace, as its gates see it.
    pub(crate) secrets: &'a dyn Fn(&SecretRef) -> Held,
}

/// The plan that brings the probes of one Pod in line with its gates and
/// checks: one catalog change per gate whose probe is added, retargeted or
/// removed; nothing for a gate whose probe is as it should be.
pub(crate) fn plan_pod(input: &PodInputs<'_>) -> PodPlan {
    let mut plan = PodPlan::default();
    let want = input.pod.map(|pod| wanted(input, pod, &mut plan)).unwrap_or_default();
    let uid = input.pod.map_or("", |p| p.uid.as_str());
    let mut want = want;
    let mut mine: Vec<(&String, &Binding)> = input.bindings.iter().filter(|(_, b)| &b.pod == input.key).collect();
    mine.sort_by_key(|(n, _)| *n);
    for (name, bound) in mine {
        match want.get(name) {
            Some((d, _, secrets)) if bound.target == d.target && bound.uid == uid && bound.secrets == *secrets => {
                want.remove(name);
            }
            Some(_) => {}
            None => plan.remove.push(name.clone()),
        }
    }
    let Some(pod) = input.pod else { return plan };
    for (name, (d, check, secrets)) in want {
        let mut replaces = input.bindings.contains_key(&name);
        if input.bindings.get(&name).is_some_and(|b| b.uid != uid) {
            // Another Pod under the same name: its probe starts afresh (a
            // replacement by an equal spec would keep the old state).
            plan.remove.push(name.clone());
            replaces = false;
        }
        match parse_target(&d, input.key, &check) {
            Ok(target) => {
                let seed = Cond::seed(pod.conditions.get(&condition_type(&check)));
                let oci = sonde_core::catalog::resolve::is_oci(d.target["probes"][0]["plugin"].as_str().unwrap_or(""));
                plan.add.push(AddProbe {
                    name,
                    check,
                    desired: d,
                    target,
                    replaces,
                    seed,
                    oci,
                    secrets,
                });
            }
            Err(errors) => plan.bad.push(BadTarget {
                name,
                check,
                replaces,
                errors,
            }),
        }
    }
    plan
}

/// The probes `pod`'s gates want, by probe name (with the check each is
/// for); what cannot be had goes into `plan`.
fn wanted(
    input: &PodInputs<'_>,
    pod: &PodView,
    plan: &mut PodPlan,
) -> BTreeMap<String, (Desired, String, SecretGrants)> {
    let mut want = BTreeMap::new();
    for check in &pod.gates {
        if (input.started)(&pod.uid, check) {
            continue;
        }
        for annotation in pod.unknown_overrides(check) {
            let message = unknown_override_message(&annotation, check);
            plan.unknown_overrides.push((annotation, message));
        }
        let Some(c) = (input.checks)(check) else {
            let message = format!("no SondeCheck {check:?} in namespace {:?}", pod.key.0);
            plan.unavailable.push((check.clone(), message));
            continue;
        };
        match desired(pod, &c, input.settings, input.services) {
            Ok(Some(d)) => {
                let passed = pod
                    .conditions
                    .get(&condition_type(check))
                    .is_some_and(|c| c.status == CondStatus::True);
                if d.mode == Mode::StartupOnly && passed {
                    plan.started.push(check.clone());
                    continue;
                }
                if let Some(secrets) = secrets_of(input, &c, check, plan) {
                    want.insert(d.name.clone(), (d, check.clone(), secrets));
                }
            }
            Ok(None) => {}
            Err(refusal) => {
                if refusal.of_check() {
                    plan.refused_checks.push((c.clone(), refusal.to_string()));
                }
                plan.refusals += 1;
                plan.unavailable.push((check.clone(), refusal.to_string()));
            }
        }
    }
    want
}

/// The cells of `c`'s `secretRefs`, when every one has a value; else
/// `None`: gate `gate` is unavailable, naming the first reference without
/// one, or, while one is not read yet, left as it is.
fn secrets_of(input: &PodInputs<'_>, c: &Arc<SondeCheck>, gate: &str, plan: &mut PodPlan) -> Option<SecretGrants> {
    let mut cells = Vec::new();
    let (mut pending, mut problem) = (false, None);
    for r in &c.spec.secret_refs {
        let note = match (input.secrets)(r) {
            Held::Ready(cell) => {
                cells.push(cell);
                None
            }
            Held::Pending => {
                pending = true;
                continue;
            }
            Held::Problem(p) => {
                problem.get_or_insert_with(|| p.message.clone());
                Some(p)
            }
        };
        plan.secret_notes.push((c.clone(), r.name.clone(), note));
    }
    if let Some(message) = problem {
        plan.unavailable.push((gate.to_string(), message));
        return None;
    }
    (!pending).then(|| SecretGrants::new(cells))
}

/// The Event's message for an override annotation `annotation` a Pod may
/// not set on gate `check`.
fn unknown_override_message(annotation: &str, check: &str) -> String {
    let allowed: Vec<String> = OVERRIDABLE.iter().map(|f| format!("sonde.dev/{check}.{f}")).collect();
    format!(
        "annotation {annotation} is ignored: a Pod may override only {}",
        allowed.join(", ")
    )
}

/// The config target of `d`, parsed as any config file's (its source named
/// after the SondeCheck and the Pod).
pub(crate) fn parse_target(d: &Desired, key: &PodKey, check: &str) -> Result<config::Target, ConfigErrors> {
    let source = format!("SondeCheck {}/{check} for Pod {}", key.0, key.1);
    let text = serde_json::json!({ "targets": [d.target] }).to_string();
    let file = config::parse(Path::new(&source), &text)?;
    Ok(file.targets.into_iter().next().expect("one target"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::SondeCheckSpec;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use sonde_sandbox::verdict::Status;

    fn settings() -> GateSettings {
        GateSettings::new(None, Some("node-1".into())).unwrap()
    }

    fn pod(uid: &str, conditions: serde_json::Value, annotations: serde_json::Value) -> PodView {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web-1", "uid": uid, "annotations": annotations},
            "spec": {"nodeName": "node-1", "readinessGates": [{"conditionType": "sonde.dev/ready"}],
                     "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": "10.0.0.5", "conditions": conditions}
        }))
        .unwrap();
        PodView::of(&pod).unwrap()
    }

    fn check(plugin: &str, mode: Mode) -> Arc<SondeCheck> {
        let mut c = SondeCheck::new(
            "ready",
            SondeCheckSpec {
                plugin: plugin.into(),
                port: Some(IntOrString::String("http".into())),
                mode,
                ..SondeCheckSpec::default()
            },
        );
        c.metadata.namespace = Some("shop".into());
        Arc::new(c)
    }

    /// The plan for `pod` with `check` (or none) and `bindings`.
    fn plan(pod: Option<&PodView>, check: Option<Arc<SondeCheck>>, bindings: &HashMap<String, Binding>) -> PodPlan {
        plan_with(pod, check, bindings, &|_| Held::Pending)
    }

    /// [`plan`], with `secrets` the state of each `secretRef`.
    fn plan_with(
        pod: Option<&PodView>,
        check: Option<Arc<SondeCheck>>,
        bindings: &HashMap<String, Binding>,
        secrets: &dyn Fn(&SecretRef) -> Held,
    ) -> PodPlan {
        let key = ("shop".to_string(), "web-1".to_string());
        let settings = settings();
        let checks = move |name: &str| check.clone().filter(|_| name == "ready");
        plan_pod(&PodInputs {
            key: &key,
            pod,
            checks: &checks,
            services: &|_| Err(Refusal::ServicesNotListed),
            settings: &settings,
            bindings,
            started: &|_, _| false,
            secrets,
        })
    }

    #[test]
    fn a_new_gate_adds_its_probe_seeded_from_the_condition_on_the_pod() {
        let p = pod(
            "u1",
            serde_json::json!([{"type": "sonde.dev/ready", "status": "True"}]),
            serde_json::json!({}),
        );
        let plan = plan(Some(&p), Some(check("http", Mode::Continuous)), &HashMap::new());
        assert!(plan.remove.is_empty() && plan.unavailable.is_empty() && plan.bad.is_empty());
        let [add] = &plan.add[..] else { panic!("{plan:?}") };
        assert_eq!(
            (add.name.as_str(), add.check.as_str()),
            ("k8s_shop_web-1_ready", "ready")
        );
        assert_eq!(add.desired.address, "10.0.0.5:8080");
        assert!(!add.replaces && !add.oci);
        assert_eq!(
            add.seed.state,
            Status::Success,
            "no write until a threshold is crossed again"
        );
    }

    #[test]
    fn a_bound_probe_as_it_should_be_is_left_alone_and_a_changed_one_replaced() {
        let p = pod("u1", serde_json::json!([]), serde_json::json!({}));
        let first = plan(Some(&p), Some(check("http", Mode::Continuous)), &HashMap::new());
        let add = &first.add[0];
        let bound = |target: serde_json::Value, uid: &str| {
            HashMap::from([(
                add.name.clone(),
                Binding {
                    pod: ("shop".into(), "web-1".into()),
                    uid: uid.into(),
                    check: "ready".into(),
                    target,
                    mode: Mode::Continuous,
                    secrets: SecretGrants::default(),
                },
            )])
        };
        let same = plan(
            Some(&p),
            Some(check("http", Mode::Continuous)),
            &bound(add.desired.target.clone(), "u1"),
        );
        assert!(same.add.is_empty() && same.remove.is_empty(), "{same:?}");
        let retarget = plan(
            Some(&p),
            Some(check("http", Mode::Continuous)),
            &bound(serde_json::json!({}), "u1"),
        );
        assert!(retarget.remove.is_empty());
        assert!(retarget.add[0].replaces, "one change replaces it");
        let recreated = plan(
            Some(&p),
            Some(check("http", Mode::Continuous)),
            &bound(add.desired.target.clone(), "u0"),
        );
        assert_eq!(
            recreated.remove,
            std::slice::from_ref(&add.name),
            "the old Pod's probe goes first"
        );
        assert!(!recreated.add[0].replaces, "the new Pod's starts afresh");
        let gone = plan(
            None,
            Some(check("http", Mode::Continuous)),
            &bound(add.desired.target.clone(), "u1"),
        );
        assert_eq!(gone.remove, std::slice::from_ref(&add.name));
        assert!(gone.add.is_empty() && gone.unavailable.is_empty());
    }

    #[test]
    fn a_missing_or_refused_check_makes_the_gate_unavailable() {
        let p = pod("u1", serde_json::json!([]), serde_json::json!({}));
        let missing = plan(Some(&p), None, &HashMap::new());
        assert_eq!(
            missing.unavailable,
            [(
                "ready".to_string(),
                "no SondeCheck \"ready\" in namespace \"shop\"".to_string()
            )]
        );
        assert!(missing.refused_checks.is_empty());
        let refused = plan(Some(&p), Some(check("exec", Mode::Continuous)), &HashMap::new());
        assert!(refused.add.is_empty());
        assert_eq!(refused.refusals, 1);
        let [(c, message)] = &refused.refused_checks[..] else {
            panic!("{refused:?}")
        };
        assert_eq!(c.metadata.name.as_deref(), Some("ready"));
        assert!(message.contains("allowlist"), "{message}");
        assert_eq!(refused.unavailable[0].1, *message);
    }

    #[test]
    fn a_startup_only_gate_already_true_is_marked_and_not_probed() {
        let p = pod(
            "u1",
            serde_json::json!([{"type": "sonde.dev/ready", "status": "True"}]),
            serde_json::json!({}),
        );
        let plan = plan(Some(&p), Some(check("http", Mode::StartupOnly)), &HashMap::new());
        assert_eq!(plan.started, ["ready"]);
        assert!(plan.add.is_empty());
    }

    #[test]
    fn an_unknown_override_is_reported_and_a_known_one_applied() {
        let p = pod(
            "u1",
            serde_json::json!([]),
            serde_json::json!({"sonde.dev/ready.path": "/x", "sonde.dev/ready.port": "9090"}),
        );
        let plan = plan(Some(&p), Some(check("http", Mode::Continuous)), &HashMap::new());
        let [(annotation, message)] = &plan.unknown_overrides[..] else {
            panic!("{plan:?}")
        };
        assert_eq!(annotation, "sonde.dev/ready.path");
        assert!(message.contains("sonde.dev/ready.port"), "{message}");
        assert_eq!(plan.add[0].desired.address, "10.0.0.5:9090");
    }

    /// A check with a `secretRefs` entry: held back (nothing written)
    /// while its Secret is not read, `Unknown` with a note for an Event
    /// while it has no value, and its probe holding the cell once it has;
    /// another cell under the same name replaces the probe.
    #[test]
    fn a_gate_waits_for_its_secrets_and_its_probe_holds_their_cells() {
        use crate::secrets::Problem;
        use sonde_policy::secrets::{SecretCell, SecretValue};
        let p = pod("u1", serde_json::json!([]), serde_json::json!({}));
        let mut c = (*check("http", Mode::Continuous)).clone();
        c.spec.secret_refs = vec![SecretRef {
            name: "token".into(),
            secret_name: "api-token".into(),
            key: "token".into(),
        }];
        let c = Arc::new(c);
        let none = HashMap::new();
        let pending = plan_with(Some(&p), Some(c.clone()), &none, &|_| Held::Pending);
        assert!(pending.add.is_empty() && pending.unavailable.is_empty() && pending.secret_notes.is_empty());

        let problem = Problem {
            reason: "SecretMissing",
            message: "secretRef \"token\" (...): the Secret does not exist".into(),
        };
        let missing = plan_with(Some(&p), Some(c.clone()), &none, &|_| Held::Problem(problem.clone()));
        assert!(missing.add.is_empty());
        assert_eq!(missing.unavailable, [("ready".to_string(), problem.message.clone())]);
        let [(noted, name, Some(why))] = &missing.secret_notes[..] else {
            panic!("{missing:?}")
        };
        assert_eq!(
            (noted.metadata.name.as_deref(), name.as_str()),
            (Some("ready"), "token")
        );
        assert_eq!(why, &problem);

        let cell = |v: &[u8]| {
            Arc::new(SecretCell::given(
                "token",
                "shop".into(),
                "Secret shop/api-token key token",
                SecretValue::new(v.to_vec()),
            ))
        };
        let first = cell(b"first-value");
        let ready = plan_with(Some(&p), Some(c.clone()), &none, &|_| Held::Ready(first.clone()));
        let [add] = &ready.add[..] else { panic!("{ready:?}") };
        assert_eq!(add.secrets.names().collect::<Vec<_>>(), ["token"]);
        assert_eq!(
            add.desired.target["probes"][0]["grants"]["secrets"],
            serde_json::json!(["token"])
        );
        assert!(matches!(&ready.secret_notes[..], [(_, _, None)]));
        let bound = HashMap::from([(
            add.name.clone(),
            Binding {
                pod: ("shop".into(), "web-1".into()),
                uid: "u1".into(),
                check: "ready".into(),
                target: add.desired.target.clone(),
                mode: Mode::Continuous,
                secrets: add.secrets.clone(),
            },
        )]);
        let same = plan_with(Some(&p), Some(c.clone()), &bound, &|_| Held::Ready(first.clone()));
        assert!(same.add.is_empty(), "the same cell: left alone");
        let other = cell(b"other-source");
        let moved = plan_with(Some(&p), Some(c), &bound, &|_| Held::Ready(other.clone()));
        assert!(moved.add[0].replaces, "another cell: the probe is replaced");
    }
}
