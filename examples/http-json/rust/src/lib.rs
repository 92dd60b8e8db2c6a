//! `http-json`: an HTTP JSON health endpoint check, written with sonde-sdk.
//!
//! GETs the target (a URL, or `host:port` plus `path`), requires the JSON
//! field `field` (a dotted path; array indices allowed: `checks.0.status`)
//! to equal `expected`, reports the response time, and warns when the
//! exchange took longer than `warn_after`.
//!
//! `{"path": "/health", "field": "status", "expected": "ok", "warn_after": "300ms"}`

use serde::Deserialize;
use serde_json::Value;
use sonde_sdk::http::{self, HttpRequest};
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request, duration, log};

/// The plugin config; unknown keys are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    field: String,
    expected: Value,
    #[serde(default = "default_path")]
    path: String,
    warn_after: Option<String>,
}

fn default_path() -> String {
    "/health".into()
}

const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "http-json",
  "type": "object",
  "additionalProperties": false,
  "required": ["field", "expected"],
  "properties": {
    "field": {"type": "string", "description": "Dotted path of the JSON field to check (`status`, `checks.db.state`, `items.0.ok`)."},
    "expected": {"description": "The JSON value the field must equal."},
    "path": {"type": "string", "default": "/health", "description": "Path appended to a host:port target (a URL target is used as it is)."},
    "warn_after": {"type": "string", "description": "A slower exchange is a warning (\"300ms\")."}
  }
}"#;

/// The value at `a.b.0.c` in a JSON document.
pub fn lookup<'a>(mut doc: &'a Value, dotted: &str) -> Option<&'a Value> {
    for key in dotted.split('.') {
        doc = match doc {
            Value::Object(map) => map.get(key)?,
            Value::Array(items) => items.get(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(doc)
}

/// JSON equality: `true` is not `1`, `1` is `1.0`.
pub fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

fn show(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= 80 {
        text
    } else {
        format!("{}...", text.chars().take(77).collect::<String>())
    }
}

fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(256).collect()
}

struct HttpJson;

impl Probe for HttpJson {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde examples".into(),
            description: "Checks that a JSON health endpoint reports the expected value, and how fast.".into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let warn_after = config
            .warn_after
            .as_deref()
            .map(|w| duration::parse(w).map_err(|e| ProbeError::invalid_config(format!("warn_after {w:?}: {e}"))))
            .transpose()?;
        let url = if req.target().contains("://") {
            req.target().to_string()
        } else {
            format!("http://{}{}", req.target(), config.path)
        };
        let mut request = HttpRequest::get(url.as_str(), req.remaining());
        request.headers.push(("accept".into(), "application/json".into()));
        let response = match http::send(&request) {
            Ok(r) => r,
            // The target failed (refused, timeout...): a verdict, not an error.
            Err(ProbeError::Io(why)) => return Ok(Outcome::failure(format!("GET {url}: {why}"))),
            Err(e) => return Err(e),
        };
        let seconds = response.timings.total;
        let outcome = |o: Outcome| {
            o.with_metric("response_seconds", seconds, "seconds")
                .with_metric("status_code", f64::from(response.status), "")
        };
        if !(200..300).contains(&response.status) {
            return Ok(outcome(Outcome::failure(format!("GET {url}: status {}", response.status)))
                .with_detail(excerpt(&response.body)));
        }
        let Ok(doc) = serde_json::from_slice::<Value>(&response.body) else {
            return Ok(outcome(Outcome::failure(format!("GET {url}: the body is not JSON"))).with_detail(excerpt(&response.body)));
        };
        let Some(value) = lookup(&doc, &config.field) else {
            return Ok(outcome(Outcome::failure(format!("{}: no such field", config.field))).with_detail(excerpt(&response.body)));
        };
        if !json_equal(value, &config.expected) {
            return Ok(outcome(Outcome::failure(format!(
                "{} is {}, expected {}",
                config.field,
                show(value),
                show(&config.expected)
            ))));
        }
        let took = duration::format(std::time::Duration::from_millis((seconds * 1000.0).round() as u64));
        if let Some(limit) = warn_after
            && seconds > limit.as_secs_f64()
        {
            return Ok(outcome(Outcome::warning(format!(
                "{} is {}, but the answer took {took} (over {})",
                config.field,
                show(value),
                duration::format(limit)
            ))));
        }
        log::debug(format!("{url}: {} = {} in {took}", config.field, show(value)));
        Ok(outcome(Outcome::success(format!("{} is {} ({took})", config.field, show(value)))))
    }
}

sonde_sdk::export!(HttpJson);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lookup_follows_dotted_paths_and_indices() {
        let doc = json!({"a": {"b": [1, {"c": "x"}]}});
        assert_eq!(lookup(&doc, "a.b.1.c"), Some(&json!("x")));
        assert_eq!(lookup(&doc, "a.b.2"), None);
        assert_eq!(lookup(&doc, "a.x"), None);
    }

    #[test]
    fn json_types_are_compared_strictly() {
        assert!(!json_equal(&json!(true), &json!(1)));
        assert!(json_equal(&json!(1), &json!(1.0)));
        assert!(json_equal(&json!({"a": [1]}), &json!({"a": [1.0]})));
    }
}
