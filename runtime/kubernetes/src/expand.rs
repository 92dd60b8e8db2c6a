//! Whose gate a check is: `$(POD_IP)`-style references in a SondeCheck's
//! `config`, expanded for each Pod before the catalog checks the config.
//!
//! The syntax and its edge cases are Kubernetes' own for a container's
//! `env` and `args`: `$(NAME)` is replaced by the variable's value when the
//! variable is defined, left as written when it is not; `$$` is a literal
//! `$`, so `$$(POD_IP)` stays `$(POD_IP)`. Only string values are expanded
//! (anywhere in the JSON document, not its keys), so a plugin sees ordinary
//! config and needs no new import: plugins built against `sonde:probe@0.1.0`
//! get the Pod's identity as they are.
//!
//! The variables:
//!
//! | name | value |
//! | --- | --- |
//! | `POD_IP` | the Pod's primary IP (`status.podIP`), either family |
//! | `POD_IPV4` / `POD_IPV6` | its address of that family, from `status.podIPs` |
//! | `POD_NAME`, `POD_NAMESPACE` | its name and namespace |
//! | `NODE_NAME` | the node it runs on (`spec.nodeName`) |
//!
//! A variable the Pod does not have (an IPv4-only Pod's `POD_IPV6`) is not
//! defined, so its reference stays as written and the plugin sees the
//! literal text — which a check comparing addresses will not match.

use serde_json::Value;

/// What a check may know of the Pod whose gate it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodIdentity {
    /// `status.podIP`.
    pub(crate) ip: Option<String>,
    /// The IPv4 address among `status.podIPs`.
    pub(crate) ipv4: Option<String>,
    /// The IPv6 address among `status.podIPs`.
    pub(crate) ipv6: Option<String>,
    /// `metadata.name`.
    pub(crate) name: String,
    /// `metadata.namespace`.
    pub(crate) namespace: String,
    /// `spec.nodeName`.
    pub(crate) node: Option<String>,
}

impl PodIdentity {
    /// The value of the variable `name`, when this Pod defines it.
    fn var(&self, name: &str) -> Option<&str> {
        match name {
            "POD_IP" => self.ip.as_deref(),
            "POD_IPV4" => self.ipv4.as_deref(),
            "POD_IPV6" => self.ipv6.as_deref(),
            "POD_NAME" => Some(&self.name),
            "POD_NAMESPACE" => Some(&self.namespace),
            "NODE_NAME" => self.node.as_deref(),
            _ => None,
        }
    }
}

/// `config` with every string value's references to `pod`'s variables
/// expanded.
pub(crate) fn expand(config: &Value, pod: &PodIdentity) -> Value {
    expand_with(config, &|name| pod.var(name))
}

/// `config` with every string value's references to the variables `var`
/// defines expanded (a node check's `$(NODE_NAME)`, `$(NODE_IP)`).
pub(crate) fn expand_with<'a>(config: &Value, var: &dyn Fn(&str) -> Option<&'a str>) -> Value {
    match config {
        Value::String(s) => Value::String(expand_str(s, var)),
        Value::Array(items) => Value::Array(items.iter().map(|v| expand_with(v, var)).collect()),
        Value::Object(fields) => Value::Object(fields.iter().map(|(k, v)| (k.clone(), expand_with(v, var))).collect()),
        other => other.clone(),
    }
}

/// One string, expanded with Kubernetes' rules.
pub(crate) fn expand_str<'a>(s: &str, var: impl Fn(&str) -> Option<&'a str>) -> String {
    if !s.contains('$') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            // `$$`: one literal `$`, and what follows is not a reference.
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match var(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> PodIdentity {
        PodIdentity {
            ip: Some("10.0.3.7".into()),
            ipv4: Some("10.0.3.7".into()),
            ipv6: None,
            name: "egress-1".into(),
            namespace: "tailnet".into(),
            node: Some("node-a".into()),
        }
    }

    #[test]
    fn references_expand_in_every_string_value_and_nowhere_else() {
        let config = json!({
            "path": "/healthz",
            "backend": {"header": "Pod-IPv4", "equals": "$(POD_IP)", "attempts": 6},
            "headers": {"X-From": "$(POD_NAMESPACE)/$(POD_NAME) on $(NODE_NAME)"},
            "list": ["$(POD_IPV4)", 3, true, null],
            "$(POD_IP)": "keys stay",
        });
        assert_eq!(
            expand(&config, &pod()),
            json!({
                "path": "/healthz",
                "backend": {"header": "Pod-IPv4", "equals": "10.0.3.7", "attempts": 6},
                "headers": {"X-From": "tailnet/egress-1 on node-a"},
                "list": ["10.0.3.7", 3, true, null],
                "$(POD_IP)": "keys stay",
            })
        );
    }

    #[test]
    fn kubernetes_edge_cases() {
        let p = pod();
        let e = |s: &str| expand_str(s, |n| p.var(n));
        // Undefined (unknown, or absent for this Pod): left as written.
        assert_eq!(e("$(POD_IPV6)"), "$(POD_IPV6)");
        assert_eq!(e("$(HOME)/x"), "$(HOME)/x");
        // `$$` escapes.
        assert_eq!(e("$$(POD_IP)"), "$(POD_IP)");
        assert_eq!(e("$$$(POD_IP)"), "$10.0.3.7");
        assert_eq!(e("cost: 5$"), "cost: 5$");
        // Unclosed and empty references.
        assert_eq!(e("$(POD_IP"), "$(POD_IP");
        assert_eq!(e("$()"), "$()");
        assert_eq!(e("a$b"), "a$b");
        assert_eq!(e("$(POD_IP)$(POD_IP)"), "10.0.3.710.0.3.7");
        assert_eq!(e("no references"), "no references");
    }
}
