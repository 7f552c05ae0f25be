//! A tool's input schema, compiled: what every proposed call is checked against before policy
//! rules on it, whoever proposed it. A call that does not match is answered, never sent.

use serde_json::Value;

use super::args::Args;

/// How many of a call's mismatches the answer names; the rest are counted.
const NAMED_ERRORS: usize = 3;

/// A JSON Schema ready to check arguments against. References stay inside the schema: none
/// is fetched from a file or the network.
pub struct Schema(jsonschema::Validator);

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schema")
    }
}

impl Schema {
    /// Compiles `schema`, after checking it against its draft's meta-schema; else why not.
    pub fn compile(schema: &Value) -> Result<Self, String> {
        jsonschema::meta::validate(schema).map_err(|e| e.masked().to_string())?;
        jsonschema::validator_for(schema)
            .map(Self)
            .map_err(|e| e.masked().to_string())
    }

    /// `Ok` if `args` match; else what does not, in words a model can act on: where, and what
    /// the schema wants (never the value itself, which may be long).
    pub fn check(&self, args: &Args) -> Result<(), String> {
        let value = args.as_value();
        let errors: Vec<String> = self
            .0
            .iter_errors(&value)
            .map(|error| {
                let at = error.instance_path().to_string();
                let what = error.masked().to_string();
                match at.is_empty() {
                    true => what,
                    false => format!("at {at}: {what}"),
                }
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        let mut why = errors[..errors.len().min(NAMED_ERRORS)].join("; ");
        if errors.len() > NAMED_ERRORS {
            why.push_str(&format!(" (and {} more)", errors.len() - NAMED_ERRORS));
        }
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refund() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount_cents": {"type": "integer", "minimum": 1}
            },
            "required": ["order_id", "amount_cents"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    fn args(value: Value) -> Args {
        Args::new(value).unwrap()
    }

    #[test]
    fn matching_arguments_pass() {
        let ok = args(json!({"order_id": "ord_55", "amount_cents": 12500}));
        assert_eq!(refund().check(&ok), Ok(()));
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let why = refund()
            .check(&args(json!({"order_id": "ord_55"})))
            .unwrap_err();
        assert!(why.contains("amount_cents"), "{why}");
        assert!(why.contains("required"), "{why}");
    }

    #[test]
    fn a_field_the_schema_forbids_is_named_without_its_value() {
        let extra = args(json!({"order_id": "o", "amount_cents": 1, "note": "secret-ish"}));
        let why = refund().check(&extra).unwrap_err();
        assert!(why.contains("note"), "{why}");
        assert!(!why.contains("secret-ish"), "{why}");
    }

    #[test]
    fn a_wrong_type_or_range_says_where() {
        let why = refund()
            .check(&args(json!({"order_id": 55, "amount_cents": 0})))
            .unwrap_err();
        assert!(why.contains("/order_id"), "{why}");
        assert!(why.contains("/amount_cents"), "{why}");
    }

    #[test]
    fn a_schema_that_is_not_a_schema_is_refused() {
        assert!(Schema::compile(&json!({"type": "object", "required": "order_id"})).is_err());
        assert!(Schema::compile(&json!({"type": "objekt"})).is_err());
        assert!(Schema::compile(&json!({"type": "string", "pattern": "("})).is_err());
    }
}
