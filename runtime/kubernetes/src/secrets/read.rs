//! One read of one Secret: `GET /api/v1/namespaces/{ns}/secrets/{name}`,
//! the answer parsed by the agent itself into the values of the keys asked
//! for, each a [`SecretValue`] at once.
//!
//! Not through `Api::<Secret>::get`: the client logs the whole answer when
//! it cannot parse it, and `k8s_openapi`'s `Secret` prints its data. Here
//! the answer's bytes go from the HTTP body to a parser of the one field
//! read (`data`), the values of other keys and the received bytes are
//! zeroed, and no text of the answer reaches a message or a log (an error
//! says what kind of answer it was, never what it held).

use http_body_util::{BodyExt, Limited};
use k8s_openapi::ByteString;
use sonde_policy::secrets::{SecretError, SecretValue};
use std::collections::BTreeMap;
use std::time::Duration;
use zeroize::Zeroize;

/// The longest a read may take.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read: a Secret holds at most 1 MiB, base64 makes it
/// 4/3 of that.
pub(crate) const MAX_ANSWER: usize = 2 * 1024 * 1024;

/// What one read of a Secret found.
pub(crate) enum Outcome {
    /// The Secret: the values of the keys asked for that it has (each
    /// checked: 8 bytes to 64 KiB), and the names of all its keys.
    Read {
        values: BTreeMap<String, Result<SecretValue, SecretError>>,
        keys: Vec<String>,
    },
    /// 404: no such Secret.
    NotFound,
    /// 403: the agent may not read it.
    Forbidden,
    /// Any other answer, or none: why, in the agent's words.
    Failed(String),
}

/// Reads Secret `name` of `namespace` through `client`, keeping the values
/// of `keys`.
pub(crate) async fn read(client: kube::Client, namespace: &str, name: &str, keys: &[String]) -> Outcome {
    match tokio::time::timeout(READ_TIMEOUT, get(client, namespace, name, keys)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Failed(format!("no answer within {}s", READ_TIMEOUT.as_secs())),
    }
}

async fn get(client: kube::Client, namespace: &str, name: &str, keys: &[String]) -> Outcome {
    // Both names were checked (a namespace's and a Secret's): nothing to escape.
    let request = http::Request::get(format!("/api/v1/namespaces/{namespace}/secrets/{name}"))
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::empty());
    let Ok(request) = request else {
        return Outcome::Failed("not a path".into());
    };
    let response = match client.send(request).await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(transport(&e)),
    };
    match response.status().as_u16() {
        200 => {}
        404 => return Outcome::NotFound,
        403 => return Outcome::Forbidden,
        401 => return Outcome::Failed("the API server refused the agent's credentials (401)".into()),
        code => return Outcome::Failed(format!("the API server answered {code}")),
    }
    let body = match Limited::new(response.into_body(), MAX_ANSWER).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Outcome::Failed(format!("the answer was cut short or larger than {MAX_ANSWER} bytes")),
    };
    let mut bytes = Vec::from(body);
    let outcome = parse(&bytes, keys);
    bytes.zeroize();
    outcome
}

/// What a transport error says, in words that hold nothing of an answer.
fn transport(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("the API server answered {}", s.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) => "the API server could not be reached".into(),
        _ => "the request failed".into(),
    }
}

/// A Secret as read: its `data` only (`stringData` is write-only).
#[derive(serde::Deserialize)]
struct Wire {
    #[serde(default)]
    data: Option<BTreeMap<String, ByteString>>,
}

/// The values of `keys` in the Secret `bytes` holds; every other value is
/// zeroed.
fn parse(bytes: &[u8], keys: &[String]) -> Outcome {
    let Ok(wire) = serde_json::from_slice::<Wire>(bytes) else {
        // serde's message may quote the answer: not kept.
        return Outcome::Failed("the answer is not a Secret".into());
    };
    let mut data = wire.data.unwrap_or_default();
    let names: Vec<String> = data.keys().cloned().collect();
    let mut values = BTreeMap::new();
    for k in keys {
        if let Some(v) = data.get_mut(k) {
            values.insert(k.clone(), SecretValue::new(std::mem::take(&mut v.0)));
        }
    }
    for (_, mut v) in data {
        v.0.zeroize();
    }
    Outcome::Read { values, keys: names }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_keys_asked_for_are_kept_each_checked() {
        let answer = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "api", "namespace": "shop"},
            "data": {"token": "c3VwZXItc2VjcmV0LXRva2Vu", "short": "YWJj", "other": "aWdub3JlZC12YWx1ZQ=="}
        });
        let keys = ["token".to_string(), "short".to_string(), "absent".to_string()];
        let Outcome::Read { values, keys: names } = parse(answer.to_string().as_bytes(), &keys) else {
            panic!("read");
        };
        assert_eq!(values["token"].as_ref().unwrap().expose(), b"super-secret-token");
        assert_eq!(values["short"], Err(SecretError::TooShort(3)));
        assert_eq!(values.len(), 2, "other keys' values are not kept");
        assert_eq!(names, ["other", "short", "token"]);
        let Outcome::Read { values, .. } = parse(br#"{"kind": "Secret"}"#, &keys) else {
            panic!("an empty Secret");
        };
        assert!(values.is_empty());
    }

    #[test]
    fn an_answer_that_is_no_secret_is_not_quoted() {
        let answer = br#"{"data": {"token": "not base64 but-a-secret-value"}}"#;
        let Outcome::Failed(why) = parse(answer, &["token".into()]) else {
            panic!("refused");
        };
        assert_eq!(why, "the answer is not a Secret");
    }
}
