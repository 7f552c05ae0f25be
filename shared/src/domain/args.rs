//! A tool call's arguments and the hash that binds a decision to them: to the agent, the tool
//! and the arguments together, so one decision can never cover another tool's call.

use std::fmt;
use std::io::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::ids::AgentName;

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

    /// The arguments by name.
    pub fn fields(&self) -> &Map<String, Value> {
        &self.0
    }

    pub fn as_value(&self) -> Value {
        Value::Object(self.0.clone())
    }

    /// The canonical form: keys sorted at every depth, no whitespace, integral numbers
    /// written as integers. Equal arguments always give the same bytes.
    pub fn canonical(&self) -> String {
        let mut out = Vec::new();
        write_object(&self.0, &mut out);
        into_text(out)
    }

    /// The hash of the first scheme, over the arguments alone: what approvals stored before
    /// the hash covered the agent and the tool are verified with.
    fn legacy_hash(&self) -> ArgsHash {
        ArgsHash(format!("{LEGACY_SCHEME}{}", sha256_hex(self.canonical())))
    }
}

impl fmt::Display for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// The canonical form of any JSON value, as [`Args::canonical`] writes arguments.
pub fn canonical(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    into_text(out)
}

/// The canonical form's bytes, written as JSON: always UTF-8.
fn into_text(out: Vec<u8>) -> String {
    String::from_utf8(out).expect("JSON is UTF-8")
}

fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    write_list(out, [b'{', b'}'], keys, |key, out| {
        write_json(key, out);
        out.push(b':');
        write_canonical(&map[key], out);
    });
}

/// `items` between the `brackets`, each written by `write`, with a comma between two.
fn write_list<T>(
    out: &mut Vec<u8>,
    [open, close]: [u8; 2],
    items: impl IntoIterator<Item = T>,
    mut write: impl FnMut(T, &mut Vec<u8>),
) {
    out.push(open);
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(item, out);
    }
    out.push(close);
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => write_object(map, out),
        Value::Array(items) => write_list(out, [b'[', b']'], items, write_canonical),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                let _ = write!(out, "{}", f as i64);
            }
            _ => write_json(n, out),
        },
        other => write_json(other, out),
    }
}

/// A string, number, boolean or null as serde_json writes it, straight into `out`.
fn write_json(value: &(impl Serialize + ?Sized), out: &mut Vec<u8>) {
    serde_json::to_writer(out, value).expect("a JSON scalar serializes");
}

checked_conversions!(Args, Value, ArgsError, |value| Self::new(value), |args| {
    Value::Object(args.0)
});

/// How a hash of the first scheme (the arguments alone) starts: `sha256:<hex>`.
const LEGACY_SCHEME: &str = "sha256:";
/// How a hash of the current scheme starts: `v2:sha256:<hex>`, over the canonical object
/// `{"agent", "args", "tool"}`.
const SCHEME: &str = "v2:sha256:";

fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What a decision is bound to besides the version: SHA-256 of the agent's name, the tool's and
/// the canonical arguments, written `v2:sha256:<hex>`. Hashes of the first scheme
/// (`sha256:<hex>`, the arguments alone) still verify, as they were made.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArgsHash(String);

impl ArgsHash {
    /// The hash of one call: `agent` proposing `tool` with `args`.
    pub fn of_call(agent: &AgentName, tool: &str, args: &Args) -> Self {
        // The canonical object written field by field, its keys in their sorted order, rather
        // than a copy of the arguments built into an object first.
        let mut call = Vec::with_capacity(128);
        call.extend_from_slice(br#"{"agent":"#);
        write_json(agent.as_str(), &mut call);
        call.extend_from_slice(br#","args":"#);
        write_object(&args.0, &mut call);
        call.extend_from_slice(br#","tool":"#);
        write_json(tool, &mut call);
        call.push(b'}');
        Self(format!("{SCHEME}{}", sha256_hex(call)))
    }

    /// Whether this hash is the one of `agent` proposing `tool` with `args`, under the scheme
    /// it was made with.
    pub fn binds(&self, agent: &AgentName, tool: &str, args: &Args) -> bool {
        if self.0.starts_with(SCHEME) {
            *self == Self::of_call(agent, tool, args)
        } else {
            *self == args.legacy_hash()
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first hex digits, enough for a person to compare two hashes by eye.
    pub fn short(&self) -> &str {
        let hex = self.0.rsplit(':').next().unwrap_or_default();
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

    fn hash(args: &Args) -> ArgsHash {
        hash_of("expense", "reimburse", args)
    }

    fn hash_of(agent: &str, tool: &str, args: &Args) -> ArgsHash {
        ArgsHash::of_call(&AgentName::parse(agent).unwrap(), tool, args)
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a: Value =
            serde_json::from_str(r#"{"b": {"y": 1, "x": [2, 1]}, "a": "c-102"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"c-102","b":{"x":[2,1],"y":1}}"#).unwrap();
        assert_eq!(hash(&args(a)), hash(&args(b)));
    }

    #[test]
    fn integral_floats_hash_like_integers() {
        assert_eq!(
            hash(&args(json!({"amount_cents": 25000.0}))),
            hash(&args(json!({"amount_cents": 25000})))
        );
        assert_eq!(args(json!({"n": 1.5})).canonical(), r#"{"n":1.5}"#);
    }

    #[test]
    fn any_change_of_value_changes_the_hash() {
        let base = args(json!({"claim_id": "c-102", "amount_cents": 25000}));
        assert_ne!(hash(&base), hash(&base.with("amount_cents", json!(24999))));
        assert_ne!(hash(&base), hash(&base.with("claim_id", json!("c-103"))));
        assert_ne!(
            hash(&args(json!({"x": [1, 2]}))),
            hash(&args(json!({"x": [2, 1]})))
        );
    }

    #[test]
    fn two_tools_or_two_agents_with_the_same_arguments_hash_differently() {
        let customer = args(json!({"customer_id": "cus_9"}));
        let lookup = hash_of("support", "lookup_customer", &customer);
        assert_ne!(lookup, hash_of("support", "cancel_customer", &customer));
        assert_ne!(lookup, hash_of("billing", "lookup_customer", &customer));
        assert!(lookup.binds(
            &AgentName::parse("support").unwrap(),
            "lookup_customer",
            &customer
        ));
        assert!(!lookup.binds(
            &AgentName::parse("support").unwrap(),
            "cancel_customer",
            &customer
        ));
    }

    #[test]
    fn a_hash_of_the_first_scheme_still_verifies_its_arguments() {
        let a = args(json!({"claim_id": "c-102", "amount_cents": 25000}));
        // As an approval stored it before the hash covered the agent and the tool.
        let stored: ArgsHash = serde_json::from_value(json!(
            "sha256:b604fd708eeaef79e59d1b70d25ba4a4edcc960282a3aaa0aa2916738bc38b42"
        ))
        .unwrap();
        let agent = AgentName::parse("expense").unwrap();
        assert!(stored.binds(&agent, "reimburse", &a));
        assert!(!stored.binds(&agent, "reimburse", &a.with("amount_cents", json!(1))));
        assert_eq!(stored.short(), "b604fd708eea");
    }

    #[test]
    fn a_calls_hash_is_the_canonical_object_of_its_agent_arguments_and_tool() {
        let a = args(json!({"amount_cents": 25000.0, "claim_id": "c-\"102", "note": [true, null]}));
        let object = json!({"tool": "reimburse", "agent": "expense", "args": a.as_value()});
        let expected = format!("v2:sha256:{}", sha256_hex(canonical(&object)));
        assert_eq!(hash(&a).as_str(), expected);
        // As every approval since the second scheme stored it.
        assert_eq!(
            hash(&args(json!({"claim_id": "c-102", "amount_cents": 25000}))).as_str(),
            "v2:sha256:e36ca64c00be0350aed3ceb233f06cbf59e8bdde3dcc7ac2326453a838a9a92b"
        );
    }

    #[test]
    fn the_canonical_form_is_compact_sorted_json() {
        let a = args(json!({"z": null, "a": {"k": true, "b": "é\"q"}}));
        assert_eq!(a.canonical(), r#"{"a":{"b":"é\"q","k":true},"z":null}"#);
        let h = hash(&a);
        assert!(h.as_str().starts_with("v2:sha256:"));
        assert_eq!(h.as_str().len(), "v2:sha256:".len() + 64);
        assert_eq!(h.short().len(), 12);
    }

    #[test]
    fn only_objects_are_arguments() {
        assert!(Args::new(json!([1])).is_err());
        assert!(Args::new(json!("x")).is_err());
        assert!(serde_json::from_str::<Args>("null").is_err());
    }
}
