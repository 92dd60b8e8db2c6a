//! OTLP attributes: a key and its typed value.

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

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
