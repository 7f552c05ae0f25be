//! The checks an input schema passes before a model ever sees it: a JSON Schema for an object
//! of named arguments, with well-formed `properties` and `required`.

use serde_json::Value;

const TYPES: [&str; 7] = [
    "object", "string", "integer", "number", "boolean", "array", "null",
];

/// `Ok` if `schema` is a JSON Schema object for a tool's arguments; else what is wrong.
pub fn check(schema: &Value) -> Result<(), String> {
    let object = schema
        .as_object()
        .ok_or("the schema must be a table (a JSON object)")?;
    if object.get("type").and_then(Value::as_str) != Some("object") {
        return Err("the schema's type must be \"object\": a tool takes named arguments".into());
    }
    check_node(schema, "")?;
    // Every call is checked against it: it must be a schema the checker can use.
    crate::domain::schema::Schema::compile(schema)?;
    Ok(())
}

fn check_node(node: &Value, at: &str) -> Result<(), String> {
    let Some(object) = node.as_object() else {
        return Err(format!("{at}: a schema must be a table"));
    };
    let here = |key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match object.get("type") {
        None => {}
        Some(Value::String(t)) if TYPES.contains(&t.as_str()) => {}
        Some(Value::Array(ts))
            if ts
                .iter()
                .all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))) => {}
        Some(other) => {
            return Err(format!(
                "{}: {other} is not a JSON Schema type",
                here("type")
            ));
        }
    }
    let properties = match object.get("properties") {
        None => None,
        Some(Value::Object(properties)) => {
            for (name, property) in properties {
                check_node(property, &here(&format!("properties.{name}")))?;
            }
            Some(properties)
        }
        Some(_) => {
            return Err(format!(
                "{}: must be a table of schemas",
                here("properties")
            ));
        }
    };
    if let Some(required) = object.get("required") {
        let names = required
            .as_array()
            .filter(|names| names.iter().all(Value::is_string))
            .ok_or_else(|| format!("{}: must be a list of property names", here("required")))?;
        for name in names.iter().filter_map(Value::as_str) {
            if !properties.is_some_and(|p| p.contains_key(name)) {
                return Err(format!(
                    "{}: {name} is not among the properties",
                    here("required")
                ));
            }
        }
    }
    if let Some(items) = object.get("items") {
        check_node(items, &here("items"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_schema_with_typed_properties_passes() {
        let schema = json!({
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "lines": {"type": "array", "items": {"type": "integer"}}},
            "required": ["order_id"],
            "additionalProperties": false
        });
        assert_eq!(check(&schema), Ok(()));
    }

    #[test]
    fn what_is_not_a_schema_for_arguments_says_where() {
        let cases = [
            (json!("string"), "table"),
            (json!({"type": "string"}), "\"object\""),
            (
                json!({"type": "object", "properties": {"a": {"type": "text"}}}),
                "properties.a.type",
            ),
            (json!({"type": "object", "properties": []}), "properties"),
            (
                json!({"type": "object", "properties": {}, "required": ["a"]}),
                "a is not among",
            ),
            (json!({"type": "object", "required": "a"}), "required"),
        ];
        for (schema, says) in cases {
            let error = check(&schema).unwrap_err();
            assert!(error.contains(says), "{schema}: {error}");
        }
    }
}
