//! Identifiers, parsed once at the edge. Past the parser an id is known to be well formed.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {value:?} is not valid: {why}")]
pub struct IdError {
    pub kind: &'static str,
    pub value: String,
    pub why: &'static str,
}

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// A random lowercase base32 (Crockford) suffix: 12 characters, 60 bits.
fn random_suffix() -> String {
    let mut bits: u64 = rand::random();
    (0..12)
        .map(|_| {
            let c = ALPHABET[(bits & 31) as usize] as char;
            bits >>= 5;
            c
        })
        .collect()
}

fn check_chars(kind: &'static str, s: &str, max: usize) -> Result<(), IdError> {
    check_chars_and(kind, s, max, &[])
}

/// As [`check_chars`], allowing the `extra` characters too.
fn check_chars_and(kind: &'static str, s: &str, max: usize, extra: &[char]) -> Result<(), IdError> {
    let error = |why| IdError {
        kind,
        value: s.chars().take(80).collect(),
        why,
    };
    if s.is_empty() {
        return Err(error("it is empty"));
    }
    if s.len() > max {
        return Err(error("it is too long"));
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || extra.contains(&c))
    {
        return Err(error(match extra {
            [] => "only letters, digits, '-', '_' and '.' are allowed",
            _ => "only letters, digits, '-', '_', '.', '@', '+' and '|' are allowed",
        }));
    }
    Ok(())
}

/// A string identifier: what every kind of id has, whatever its own `parse` checks.
macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        checked_conversions!($name, String, IdError, |s| Self::parse(&s), |id| id.0);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

/// An id Countersign makes: a fixed prefix and a random suffix.
macro_rules! generated_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        string_id!($(#[$meta])* $name);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, random_suffix()))
            }

            pub fn parse(s: &str) -> Result<Self, IdError> {
                check_chars($kind, s, 64)?;
                if !s.starts_with($prefix) || s.len() == $prefix.len() {
                    return Err(IdError {
                        kind: $kind,
                        value: s.to_string(),
                        why: concat!("it must start with \"", $prefix, "\""),
                    });
                }
                Ok(Self(s.to_string()))
            }
        }
    };
}

/// An id someone else chooses: checked characters and length.
macro_rules! named_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal, $max:literal) => {
        named_id!($(#[$meta])* $name, $kind, $max, []);
    };
    ($(#[$meta:meta])* $name:ident, $kind:literal, $max:literal, [$($extra:literal),*]) => {
        string_id!($(#[$meta])* $name);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, IdError> {
                check_chars_and($kind, s, $max, &[$($extra),*])?;
                Ok(Self(s.to_string()))
            }
        }
    };
}

generated_id!(
    /// One agent run: a task the agent works on, possibly across several pauses.
    RunId, "run-", "run id"
);
generated_id!(
    /// One proposed tool call; its versions are `(ActionId, ActionVersion)`.
    ActionId, "act-", "action id"
);
generated_id!(
    /// One request for a person's decision on one action version.
    ApprovalId, "ap-", "approval id"
);
generated_id!(
    /// One message waiting in the outbox.
    OutboxId, "ob-", "outbox id"
);
named_id!(
    /// The organisation a run, its approvals and its people belong to.
    TenantId, "tenant id", 64
);
named_id!(
    /// A person, as authentication names them: the claim a deployment names (the subject by
    /// default), so an email address or an Auth0 subject (`auth0|…`) is a valid name too.
    PersonId, "person", 254, ['@', '+', '|']
);
named_id!(
    /// Chosen by whoever submits a decision, so that sending it twice decides once.
    DecisionId, "decision id", 128
);
named_id!(
    /// A role a person holds in their tenant, such as `finance`.
    Role, "role", 64
);
named_id!(
    /// An agent definition's name, such as `refunds`: every run belongs to one.
    AgentName, "agent name", 64
);

/// The version of an action. Version 1 is what the agent proposed; each edit adds one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct ActionVersion(u32);

impl ActionVersion {
    pub const FIRST: ActionVersion = ActionVersion(1);

    pub fn new(n: u32) -> Result<Self, IdError> {
        if n == 0 {
            return Err(IdError {
                kind: "action version",
                value: "0".into(),
                why: "versions start at 1",
            });
        }
        Ok(Self(n))
    }

    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

checked_conversions!(ActionVersion, u32, IdError, |n| Self::new(n), |v| v.0);

impl fmt::Display for ActionVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The key that makes a tool call idempotent and names its resume message: `action_id:version`.
pub fn idempotency_key(action: &ActionId, version: ActionVersion) -> String {
    format!("{action}:{version}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_carry_their_prefix_and_parse_back() {
        let id = ApprovalId::generate();
        assert!(id.as_str().starts_with("ap-"));
        assert_eq!(ApprovalId::parse(id.as_str()).unwrap(), id);
        assert_ne!(ApprovalId::generate(), ApprovalId::generate());
    }

    #[test]
    fn a_run_id_is_not_an_approval_id() {
        let run = RunId::generate();
        let err = ApprovalId::parse(run.as_str()).unwrap_err();
        assert!(err.to_string().contains("must start with \"ap-\""), "{err}");
    }

    #[test]
    fn bad_characters_and_empty_ids_are_refused() {
        assert!(PersonId::parse("").is_err());
        assert!(PersonId::parse("dana smith").is_err());
        assert!(PersonId::parse("dana/../x").is_err());
        assert!(DecisionId::parse(&"x".repeat(129)).is_err());
        assert!(ApprovalId::parse("ap-").is_err());
        assert_eq!(PersonId::parse("dana").unwrap().as_str(), "dana");
        // A deployment may name people by their email address (COUNTERSIGN_PERSON_CLAIM=email).
        assert!(PersonId::parse("dana+ops@acme.example").is_ok());
        assert!(PersonId::parse("auth0|64f1c2a7e0d4b4e558c1a3b2").is_ok());
        assert!(Role::parse("fin@nce").is_err());
    }

    #[test]
    fn version_zero_does_not_exist() {
        assert!(ActionVersion::new(0).is_err());
        assert_eq!(ActionVersion::FIRST.next().get(), 2);
        let parsed: Result<ActionVersion, _> = serde_json::from_str("0");
        assert!(parsed.is_err());
    }

    #[test]
    fn the_idempotency_key_is_action_and_version() {
        let id = ActionId::parse("act-abc").unwrap();
        assert_eq!(
            idempotency_key(&id, ActionVersion::FIRST.next()),
            "act-abc:2"
        );
    }
}
