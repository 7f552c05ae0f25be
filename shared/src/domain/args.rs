//! A tool call's arguments and the hash that binds a decision to them.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A tool call's arguments: always a JSON object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Value", into = "Value")]
pub struct Args(Map<String, Value>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool arguments must be a JSON object, not {0}")]
pub struct ArgsError(&'static str);

impl Args {
    pub fn new(value: Value) -> Result<Self, ArgsError> {
        match value {
            Value::Object(map) => Ok(Self(map)),
            Value::Null => Err(ArgsError("null")),
            Value::Array(_) => Err(ArgsError("an array")),
            Value::String(_) => Err(ArgsError("a string")),
            Value::Number(_) => Err(ArgsError("a number")),
            Value::Bool(_) => Err(ArgsError("a boolean")),
        }
    }

    pub fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field)
    }

    pub fn str(&self, field: &str) -> Option<&str> {
        self.0.get(field).and_then(Value::as_str)
    }

    pub fn int(&self, field: &str) -> Option<i64> {
        self.0.get(field).and_then(Value::as_i64)
    }

    /// A copy with one field replaced: how an edit makes the next version's arguments.
    pub fn with(&self, field: &str, value: Value) -> Self {
        let mut map = self.0.clone();
        map.insert(field.to_string(), value);
        Self(map)
    }

    pub fn as_value(&self) -> Value {
        Value::Object(self.0.clone())
    }

    /// The canonical form: keys sorted at every depth, no whitespace, integral numbers
    /// written as integers. Equal arguments always give the same bytes.
    pub fn canonical(&self) -> String {
        let mut out = String::new();
        write_canonical(&Value::Object(self.0.clone()), &mut out);
        out
    }

    pub fn hash(&self) -> ArgsHash {
        ArgsHash(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(self.canonical().as_bytes()))
        ))
    }
}

impl fmt::Display for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                let _ = write!(out, "{}", f as i64);
            }
            _ => out.push_str(&n.to_string()),
        },
        other => out.push_str(&other.to_string()),
    }
}

checked_conversions!(Args, Value, ArgsError, |value| Self::new(value), |args| {
    Value::Object(args.0)
});

/// SHA-256 of the canonical arguments, written `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArgsHash(String);

impl ArgsHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first hex digits, enough for a person to compare two hashes by eye.
    pub fn short(&self) -> &str {
        let hex = self.0.trim_start_matches("sha256:");
        &hex[..hex.len().min(12)]
    }
}

impl fmt::Display for ArgsHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Args {
        Args::new(v).unwrap()
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a: Value =
            serde_json::from_str(r#"{"b": {"y": 1, "x": [2, 1]}, "a": "c-102"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"c-102","b":{"x":[2,1],"y":1}}"#).unwrap();
        assert_eq!(args(a).hash(), args(b).hash());
    }

    #[test]
    fn integral_floats_hash_like_integers() {
        assert_eq!(
            args(json!({"amount_cents": 25000.0})).hash(),
            args(json!({"amount_cents": 25000})).hash()
        );
        assert_eq!(args(json!({"n": 1.5})).canonical(), r#"{"n":1.5}"#);
    }

    #[test]
    fn any_change_of_value_changes_the_hash() {
        let base = args(json!({"claim_id": "c-102", "amount_cents": 25000}));
        assert_ne!(base.hash(), base.with("amount_cents", json!(24999)).hash());
        assert_ne!(base.hash(), base.with("claim_id", json!("c-103")).hash());
        assert_ne!(
            args(json!({"x": [1, 2]})).hash(),
            args(json!({"x": [2, 1]})).hash()
        );
    }

    #[test]
    fn the_canonical_form_is_compact_sorted_json() {
        let a = args(json!({"z": null, "a": {"k": true, "b": "é\"q"}}));
        assert_eq!(a.canonical(), r#"{"a":{"b":"é\"q","k":true},"z":null}"#);
        assert!(a.hash().as_str().starts_with("sha256:"));
        assert_eq!(a.hash().as_str().len(), "sha256:".len() + 64);
    }

    #[test]
    fn only_objects_are_arguments() {
        assert!(Args::new(json!([1])).is_err());
        assert!(Args::new(json!("x")).is_err());
        assert!(serde_json::from_str::<Args>("null").is_err());
    }
}
