//! Every rule checked against a Cedar schema generated from what the agent has: its tools and
//! their input schemas (an action each, its arguments as `context.input`), the people's roles
//! and the policy's history windows. A rule that names an argument a tool does not have, or
//! compares a string with a number, is refused with its file, its line and the reason.

use std::collections::BTreeSet;

use cedar_policy::{Schema as CedarSchema, ValidationMode, Validator};
use miette::Diagnostic;
use serde_json::{Map, Value, json};

use super::PolicyError;
use super::cedar::{Place, Rules, line_of};

/// A tool as the schema sees it: its name and its input schema.
#[derive(Debug, Clone, Copy)]
pub struct ToolShape<'a> {
    pub name: &'a str,
    pub input_schema: &'a Value,
}

impl<'a> ToolShape<'a> {
    /// The shapes of tools given by name and input schema.
    pub fn of<Name: AsRef<str>>(tools: &'a [(Name, Value)]) -> Vec<Self> {
        tools
            .iter()
            .map(|(name, input_schema)| ToolShape {
                name: name.as_ref(),
                input_schema,
            })
            .collect()
    }
}

/// Checks every rule (the log-only ones too) against the schema of `tools`, and every role a
/// rule names against `roles` when the process knows them.
pub fn check(
    rules: &Rules,
    tools: &[ToolShape<'_>],
    windows: &[&str],
    roles: Option<&BTreeSet<String>>,
) -> Result<(), PolicyError> {
    if let Some(roles) = roles {
        for rule in &rules.rules {
            let approver = match &rule.effect {
                super::cedar::Meaning::Approve(terms) => Some(terms.role.to_string()),
                _ => None,
            };
            for role in approver.into_iter().chain(rule.roles_named()) {
                if !roles.contains(&role) {
                    let known: Vec<&str> = roles.iter().map(String::as_str).collect();
                    return Err(rule.error(format!(
                        "no person has the role {role} (the roles people have: {})",
                        known.join(", ")
                    )));
                }
            }
        }
    }
    if tools.is_empty() {
        return Ok(());
    }
    let schema = CedarSchema::from_json_value(schema(tools, windows))
        .map_err(|e| PolicyError::new(format!("the tools' schema cannot be used: {e}")))?;
    let result = Validator::new(schema).validate(rules.all(), ValidationMode::Strict);
    let Some(error) = result.validation_errors().next() else {
        return Ok(());
    };
    let rule = rules
        .get(error.policy_id().as_ref())
        .expect("a validated rule is one of the rules");
    let mut message = error.to_string();
    // Cedar names the rule by its id; the place is said already.
    if let Some(rest) = message.strip_prefix(&format!("for policy `{}`, ", rule.id)) {
        message = rest.to_string();
    }
    match argument_help(&message, tools) {
        Some(why) => message = format!("{message}: {why}"),
        None => {
            if let Some(help) = error.help() {
                message = format!("{message} ({help})");
            }
        }
    }
    let line = |start: u32| {
        let offset = error
            .labels()
            .and_then(|mut labels| labels.next())
            .map(|label| label.offset());
        // A label counts from the start of the rule's file.
        match (offset, rule.source()) {
            (Some(offset), Some(text)) => line_of(text, offset),
            _ => start,
        }
    };
    Err(match &rule.place {
        Place::Line { file, line: start } => PolicyError::in_file(file, line(*start), message),
        Place::Field(_) => rule.error(message),
    })
}

/// Why an argument a rule names is missing from a tool's context: the tool has it with a
/// JSON Schema type Cedar cannot hold (a fraction, a null, a choice of types), or has no such
/// argument (then which it has).
fn argument_help(message: &str, tools: &[ToolShape<'_>]) -> Option<String> {
    let attribute = message
        .split("attribute `input.")
        .nth(1)?
        .split('`')
        .next()?;
    let tool_name = message.split("Action::\"").nth(1)?.split('"').next()?;
    let tool = tools.iter().find(|t| t.name == tool_name)?;
    let properties = tool.input_schema["properties"].as_object();
    if let Some(property) = properties.and_then(|p| p.get(attribute)) {
        return Some(format!(
            "{tool_name}'s argument {attribute} has a JSON Schema type rules cannot read ({}): strings, whole numbers, booleans, arrays and objects of them",
            property
                .get("type")
                .map_or("none".to_string(), |t| t.to_string())
        ));
    }
    let mut readable: Vec<&str> = properties
        .into_iter()
        .flatten()
        .filter(|(_, property)| cedar_type(property).is_some())
        .map(|(name, _)| name.as_str())
        .collect();
    readable.sort_unstable();
    Some(match readable.is_empty() {
        true => format!("{tool_name} has no argument {attribute}, and none rules can read"),
        false => format!(
            "{tool_name} has no argument {attribute}; the ones rules can read: {}",
            readable.join(", ")
        ),
    })
}

/// The Cedar schema, as JSON, for `tools` and `windows`.
pub fn schema(tools: &[ToolShape<'_>], windows: &[&str]) -> Value {
    let long = || json!({"type": "Long"});
    let window = json!({"type": "Record", "attributes": {"count": long(), "sum": long()}});
    let history: Map<String, Value> = windows
        .iter()
        .map(|name| (name.to_string(), window.clone()))
        .collect();
    let context = |tool: &ToolShape<'_>| {
        json!({
            "type": "Record",
            "attributes": {
                "input": cedar_type(tool.input_schema).unwrap_or_else(|| json!({"type": "Record", "attributes": {}})),
                "hints": {"type": "Record", "attributes": {"read_only": {"type": "Boolean"}, "destructive": {"type": "Boolean"}}},
                "history": {"type": "Record", "attributes": history},
                "now": {"type": "Record", "attributes": {
                    "datetime": {"type": "Extension", "name": "datetime"},
                    "date": {"type": "String"},
                    "hour": long(),
                    "minute": long(),
                    "weekday": long(),
                    "epoch": long(),
                }},
            }
        })
    };
    let actions: Map<String, Value> = tools
        .iter()
        .map(|tool| {
            (
                tool.name.to_string(),
                json!({"appliesTo": {
                    "principalTypes": ["Person"],
                    "resourceTypes": ["Agent"],
                    "context": context(tool),
                }}),
            )
        })
        .collect();
    json!({"": {
        "entityTypes": {
            "Person": {
                "shape": {"type": "Record", "attributes": {
                    "tenant": {"type": "String"},
                    "roles": {"type": "Set", "element": {"type": "String"}},
                }},
                "tags": {"type": "String"},
            },
            "Agent": {},
        },
        "actions": actions,
    }})
}

/// A JSON Schema's Cedar type, where Cedar has one: a string, a whole number, a boolean, an
/// array of one such type, an object of such properties (the required ones required).
fn cedar_type(schema: &Value) -> Option<Value> {
    match schema.get("type")?.as_str()? {
        "string" => Some(json!({"type": "String"})),
        "integer" => Some(json!({"type": "Long"})),
        "boolean" => Some(json!({"type": "Boolean"})),
        "array" => Some(json!({"type": "Set", "element": cedar_type(schema.get("items")?)?})),
        "object" => {
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let attributes: Map<String, Value> = schema["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(name, property)| {
                    let mut attribute = cedar_type(property)?;
                    attribute["required"] = json!(required.contains(&name.as_str()));
                    Some((name.clone(), attribute))
                })
                .collect();
            Some(json!({"type": "Record", "attributes": attributes}))
        }
        _ => None,
    }
}
