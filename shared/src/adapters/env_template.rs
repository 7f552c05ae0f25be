//! `${NAME}` in a tool binding's settings (a URL, a header value), filled from the process
//! environment when the binding is built; `${NAME:-default}` falls back to the default. A
//! variable that is unset with no default fails the build at once, naming the field and the
//! variable (where the process runs tools; elsewhere the tool is one it cannot run); the values
//! themselves are never echoed, and every one filled in is a secret ([`Secrets`]).

use super::secrets::{self, MIN_SECRET_BYTES, Secrets};

/// Looks a variable up; `std::env::var` in a process, a map in tests.
pub type Lookup<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

/// The process environment, as a [`Lookup`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A setting of the process environment, trimmed; `None` when unset, empty or blank.
pub fn setting(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{field}: the environment variable {var} is not set")]
    Unset { field: String, var: String },
    #[error("{field}: `${{` must close with `}}` around a variable name (A-Z, 0-9, _)")]
    Malformed { field: String },
}

/// A binding (an HTTP tool's, an MCP server's) that cannot be used, naming the field of the
/// definition at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// A `${VAR}` that is unset or malformed.
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl BindingError {
    /// The field of the definition at fault, such as `tools.issue_refund.http.timeout`.
    pub fn field(&self) -> &str {
        match self {
            BindingError::Env(EnvError::Unset { field, .. } | EnvError::Malformed { field }) => {
                field
            }
            BindingError::Invalid { field, .. } => field,
        }
    }

    pub(super) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        BindingError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Whether `text` names any `${VAR}`: such a value may carry a secret and is never logged.
pub fn mentions_env(text: &str) -> bool {
    text.contains("${")
}

/// Replaces every `${NAME}` in `text` with the variable's value. `field` names where the text
/// came from (such as `tools.issue_refund.http.headers.Authorization`) for the error.
pub fn expand(text: &str, field: &str, env: Lookup<'_>) -> Result<String, EnvError> {
    fill(text, field, env, &mut |_, _| {})
}

/// What a text filled in holds: a credential's value too short to redact is warned of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filling {
    Text,
    /// A header's value, a stdio server's `env`.
    Credential,
}

/// [`expand`], each value it fills in (a default included) kept in `secrets` as its variable's;
/// for a [`Filling::Credential`], a value too short to redact is warned of, naming the field
/// and the variable.
pub fn expand_into(
    text: &str,
    field: &str,
    env: Lookup<'_>,
    secrets: &mut Secrets,
    filling: Filling,
) -> Result<String, EnvError> {
    fill(text, field, env, &mut |name, value| {
        let short = !value.is_empty() && value.len() < MIN_SECRET_BYTES;
        if filling == Filling::Credential && short {
            secrets::warn_too_short(field, name);
        }
        secrets.add_variable(name, value)
    })
}

/// Fills `text`, telling `filled` each variable's name and the value it filled in.
fn fill(
    text: &str,
    field: &str,
    env: Lookup<'_>,
    filled: &mut dyn FnMut(&str, &str),
) -> Result<String, EnvError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let malformed = || EnvError::Malformed {
            field: field.to_string(),
        };
        let end = after.find('}').ok_or_else(malformed)?;
        let (name, default) = match after[..end].split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (&after[..end], None),
        };
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(malformed());
        }
        let value = env(name)
            .or(default.map(str::to_string))
            .ok_or_else(|| EnvError::Unset {
                field: field.to_string(),
                var: name.to_string(),
            })?;
        out.push_str(&value);
        filled(name, &value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "ORDERS_URL" => Some("http://127.0.0.1:8790".into()),
            "ORDERS_TOKEN" => Some("s3cret".into()),
            _ => None,
        }
    }

    #[test]
    fn variables_are_filled_in_place() {
        let url = expand("${ORDERS_URL}/orders/{order_id}", "url", &env).unwrap();
        assert_eq!(url, "http://127.0.0.1:8790/orders/{order_id}");
        let header = expand("Bearer ${ORDERS_TOKEN}", "headers.Authorization", &env).unwrap();
        assert_eq!(header, "Bearer s3cret");
        assert_eq!(expand("plain", "x", &env).unwrap(), "plain");
        let fallback = expand("${NOPE:-http://localhost:1}/x", "url", &env).unwrap();
        assert_eq!(fallback, "http://localhost:1/x");
        let set = expand("${ORDERS_TOKEN:-unused}", "h", &env).unwrap();
        assert_eq!(set, "s3cret");
    }

    #[test]
    fn the_values_filled_in_are_secrets_shown_by_their_variable_defaults_included() {
        let mut secrets = Secrets::default();
        let url = expand_into(
            "${NOPE:-http://localhost:1}/x?k=${ORDERS_TOKEN}",
            "url",
            &env,
            &mut secrets,
            Filling::Text,
        )
        .unwrap();
        assert_eq!(url, "http://localhost:1/x?k=s3cret");
        assert_eq!(
            secrets.redact("at http://localhost:1 with s3cret"),
            "at ${NOPE} with ${ORDERS_TOKEN}"
        );
        let mut none = Secrets::default();
        expand_into("plain", "x", &env, &mut none, Filling::Text).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_credential_too_short_to_redact_is_warned_of_by_its_field_and_variable() {
        let env = |name: &str| match name {
            "SHORT" => Some("ab7".to_string()),
            "NONE" => Some(String::new()),
            _ => env(name),
        };
        let mut secrets = Secrets::default();
        let logged = crate::logs::logged_by(|| {
            let field = "tools.t.http.headers.X-Key";
            let credential = "${SHORT}${NONE}${ORDERS_TOKEN}";
            expand_into(credential, field, &env, &mut secrets, Filling::Credential).unwrap();
            expand_into(
                "${SHORT}",
                "tools.t.http.url",
                &env,
                &mut secrets,
                Filling::Text,
            )
            .unwrap();
        });
        assert_eq!(logged.lines().count(), 1, "{logged}");
        assert!(logged.contains("WARN"), "{logged}");
        assert!(
            logged.contains(r#"field="tools.t.http.headers.X-Key" variable="SHORT""#),
            "{logged}"
        );
        assert!(!logged.contains("ab7"), "{logged}");
        assert_eq!(secrets.redact("ab7 s3cret"), "ab7 ${ORDERS_TOKEN}");
    }

    #[test]
    fn an_unset_variable_names_the_field_and_the_variable() {
        let error = expand("Bearer ${NOPE}", "tools.t.http.headers.Authorization", &env)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "tools.t.http.headers.Authorization: the environment variable NOPE is not set"
        );
    }

    #[test]
    fn a_malformed_reference_is_refused() {
        for text in ["${ORDERS_URL", "${}", "${lower}", "${A-B}"] {
            assert!(
                matches!(expand(text, "url", &env), Err(EnvError::Malformed { .. })),
                "{text}"
            );
        }
    }
}
