//! OTLP attributes: a key and its typed value; and who sends them (the
//! resource and the instrumentation scope every export names).

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// The resource of `attributes` (the agent's: [`crate::resource`]).
pub(crate) fn resource(attributes: &[KeyValue]) -> Option<Resource> {
    Some(Resource {
        attributes: attributes.to_vec(),
        ..Resource::default()
    })
}

/// The instrumentation scope of everything sonde sends: `sonde`, its
/// version.
pub(crate) fn scope() -> Option<InstrumentationScope> {
    Some(InstrumentationScope {
        name: "sonde".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..InstrumentationScope::default()
    })
}

/// A string attribute.
pub(crate) fn attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..KeyValue::default()
    }
}

/// An integer attribute.
pub(crate) fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..KeyValue::default()
    }
}
