//! The shipped CRD against the type it is generated from.

use serde_json::{Value, json};
use std::path::Path;

/// `deploy/kubernetes/crd.yaml` is generated from the `SondeCheck` type
/// (`SONDE_WRITE_CRD=1` rewrites it): the shipped file parses as an
/// `apiextensions.k8s.io/v1` CustomResourceDefinition equal to the type's,
/// byte for byte what the generator writes, and it keeps the CEL rules
/// and printer columns the API server enforces and `kubectl get` shows.
#[test]
fn shipped_crd_is_generated_from_the_sondecheck_type() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use sonde_kubernetes::crd::SondeCheck;
    use sonde_kubernetes::crd_yaml;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/crd.yaml");
    let generated = crd_yaml();
    if std::env::var_os("SONDE_WRITE_CRD").is_some() {
        std::fs::write(&path, &generated).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let shipped = std::fs::read_to_string(&path).unwrap();
    let regenerate = "the SondeCheck type and deploy/kubernetes/crd.yaml disagree: regenerate it with SONDE_WRITE_CRD=1 cargo test --workspace --test all -- shipped_crd";
    let docs: Vec<&str> = shipped.split("\n---\n").collect();
    assert_eq!(docs.len(), 2, "SondeCheck, then SondeNodeCheck");
    let parsed: CustomResourceDefinition =
        serde_saphyr::from_str(docs[0]).unwrap_or_else(|e| panic!("{}: not a CRD: {e}", path.display()));
    assert!(parsed == SondeCheck::crd(), "{regenerate}");
    let node: CustomResourceDefinition =
        serde_saphyr::from_str(docs[1]).unwrap_or_else(|e| panic!("{}: not a CRD: {e}", path.display()));
    assert!(node == sonde_kubernetes::node::SondeNodeCheck::crd(), "{regenerate}");
    assert!(shipped == generated, "{regenerate} (the text differs)");

    let crd = serde_json::to_value(&parsed).unwrap();
    assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(crd["metadata"]["name"], "sondechecks.sonde.dev");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["sck"]));
    assert_eq!(crd["spec"]["names"]["categories"], json!(["sonde"]));
    let version = &crd["spec"]["versions"][0];
    let columns: Vec<(&str, &str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["type"].as_str().unwrap(),
                c["jsonPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("Plugin", "string", ".spec.plugin"),
            ("Mode", "string", ".spec.mode"),
            (
                "Accepted",
                "string",
                ".status.conditions[?(@.type==\"Accepted\")].status"
            ),
            ("Ready", "integer", ".status.podsReady"),
            ("NotReady", "integer", ".status.podsNotReady"),
            ("Unknown", "integer", ".status.podsUnknown"),
            ("Reason", "string", ".status.conditions[?(@.type==\"Accepted\")].reason"),
            ("Port", "string", ".spec.port"),
            ("Service", "string", ".spec.service.name"),
            ("Period", "integer", ".spec.periodSeconds"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
    // The status is a subresource: the agents' status writes cannot touch
    // the spec, and a user's spec writes cannot forge the status.
    assert_eq!(version["subresources"], json!({"status": {}}));
    let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    for k in ["observedGeneration", "podsReady", "podsNotReady", "podsUnknown"] {
        assert_eq!(status[k]["type"], "integer", "{k}");
    }
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let rules = |v: &Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_array()
            .unwrap_or_else(|| panic!("no CEL rules in {v}"))
            .iter()
            .map(|r| r["rule"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        rules(spec),
        [
            "has(self.port) ? !has(self.service) : has(self.service)",
            "!has(self.timeoutSeconds) || !has(self.periodSeconds) || self.timeoutSeconds <= self.periodSeconds"
        ]
    );
    assert_eq!(
        rules(&spec["properties"]["plugin"]),
        ["!self.startsWith('oci://') || self.contains('@sha256:')"]
    );
    // An int-or-string is costed at the largest request whatever its
    // maxLength: its name is checked by OpenAPI's maxLength and pattern
    // (strings only), CEL checks only the number's range (no string
    // function, whose cost put the CRD over its budget on Kubernetes 1.24).
    let name = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
    for (port, max) in [
        (&spec["properties"]["port"], 15),
        (&spec["properties"]["service"]["properties"]["port"], 63),
    ] {
        assert_eq!(port["x-kubernetes-int-or-string"], true);
        assert_eq!(rules(port), ["type(self) != int || (self >= 1 && self <= 65535)"]);
        assert_eq!(
            (port["maxLength"].as_u64(), port["pattern"].as_str()),
            (Some(max), Some(name))
        );
    }
    assert_eq!(spec["required"], json!(["plugin"]));
    let service = &spec["properties"]["service"];
    assert_eq!(service["required"], json!(["name", "port"]));
    assert_eq!(service["properties"]["port"]["x-kubernetes-int-or-string"], true);
    assert_eq!(rules(&service["properties"]["port"]).len(), 1);
    assert_eq!(
        spec["properties"]["config"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(spec["properties"]["mode"]["enum"], json!(["Continuous", "StartupOnly"]));
}

/// The shipped SondeNodeCheck CRD: cluster-scoped, a status subresource,
/// and every string a CEL rule reads bounded by `maxLength`, so the rules'
/// estimated cost fits the budget of the oldest supported API server
/// (the e2e test installs it on a real one).
#[test]
fn shipped_node_crd_is_cluster_scoped_and_its_rules_are_bounded() {
    use kube::CustomResourceExt;
    use sonde_kubernetes::node::SondeNodeCheck;
    let crd = serde_json::to_value(SondeNodeCheck::crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "sondenodechecks.sonde.dev");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["snc"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["subresources"], json!({"status": {}}));
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], json!(["condition", "plugin", "target"]));
    let props = &spec["properties"];
    for (field, max) in [
        (&props["plugin"], 512),
        (&props["condition"]["properties"]["type"], 316),
        (&props["taint"]["properties"]["key"], 316),
    ] {
        assert!(field["x-kubernetes-validations"].is_array(), "{field}");
        assert_eq!(field["maxLength"], max, "{field}");
    }
    let type_rule = &props["condition"]["properties"]["type"]["x-kubernetes-validations"][0]["rule"];
    for kubelet in sonde_kubernetes::node::KUBELET_CONDITIONS {
        assert!(
            type_rule.as_str().unwrap().contains(&format!("'{kubelet}'")),
            "{type_rule}"
        );
    }
    assert_eq!(
        props["taint"]["properties"]["effect"]["enum"],
        json!(["NoSchedule", "PreferNoSchedule", "NoExecute"])
    );
    assert_eq!(
        props["condition"]["properties"]["problemReason"]["default"],
        "CheckFailed"
    );
    assert_eq!(
        props["nodeSelector"]["properties"]["matchExpressions"]["items"]["properties"]["operator"]["enum"],
        json!(["In", "NotIn", "Exists", "DoesNotExist"])
    );
}
