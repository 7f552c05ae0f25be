//! Who is acting: always from authentication, never from a request body.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::ids::{PersonId, Role, TenantId};

/// An authenticated person, as the engine sees them at the moment they act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub tenant: TenantId,
    pub person: PersonId,
    pub roles: BTreeSet<Role>,
}

impl Identity {
    pub fn has_role(&self, role: &Role) -> bool {
        self.roles.contains(role)
    }
}

/// Who did something, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Actor {
    Person {
        id: PersonId,
    },
    /// The agent itself, proposing and explaining.
    Agent,
    /// A policy rule, by the policy's version.
    Policy {
        version: u32,
    },
    /// The engine's own bookkeeping: the sweep, a resume.
    System {
        component: String,
    },
}

impl Actor {
    pub fn person(id: &PersonId) -> Self {
        Actor::Person { id: id.clone() }
    }

    pub fn system(component: &str) -> Self {
        Actor::System {
            component: component.to_string(),
        }
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Person { id } => write!(f, "{id}"),
            Actor::Agent => f.write_str("agent"),
            Actor::Policy { version } => write!(f, "policy v{version}"),
            Actor::System { component } => write!(f, "{component}"),
        }
    }
}

/// The people a local deployment knows, loaded from a data file. In Lambda the same facts
/// arrive as JWT claims instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Directory {
    pub people: Vec<Person>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Person {
    pub name: PersonId,
    pub tenant: TenantId,
    #[serde(default)]
    pub roles: BTreeSet<Role>,
    /// The person's Slack user id (such as `U024BE7LH`): a click on a notice's button in Slack
    /// acts as this person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slack: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    #[error("the people directory is not valid: {0}")]
    Invalid(String),
    #[error("{0:?} is not in the people directory")]
    UnknownPerson(String),
}

impl Directory {
    pub fn from_toml(text: &str) -> Result<Self, DirectoryError> {
        let directory: Directory =
            super::toml_text::from_str(text).map_err(|e| DirectoryError::Invalid(e.to_string()))?;
        let mut names = BTreeSet::new();
        let mut slack_users = BTreeSet::new();
        for person in &directory.people {
            if !names.insert(&person.name) {
                return Err(DirectoryError::Invalid(format!(
                    "{} is listed twice",
                    person.name
                )));
            }
            if let Some(user) = &person.slack {
                let well_formed = !user.is_empty()
                    && user.len() <= 32
                    && user.chars().all(|c| c.is_ascii_alphanumeric());
                if !well_formed {
                    return Err(DirectoryError::Invalid(format!(
                        "{}'s slack user id {:?} is not a Slack user id such as U024BE7LH",
                        person.name,
                        user.chars().take(40).collect::<String>()
                    )));
                }
                if !slack_users.insert(user) {
                    return Err(DirectoryError::Invalid(format!(
                        "slack user {user} is given to two people"
                    )));
                }
            }
        }
        Ok(directory)
    }

    /// The person a Slack user id belongs to, as an identity with their tenant and roles.
    pub fn by_slack_user(&self, user: &str) -> Option<Identity> {
        self.people
            .iter()
            .find(|p| p.slack.as_deref() == Some(user))
            .map(|p| Identity {
                tenant: p.tenant.clone(),
                person: p.name.clone(),
                roles: p.roles.clone(),
            })
    }

    pub fn identify(&self, name: &str) -> Result<Identity, DirectoryError> {
        self.people
            .iter()
            .find(|p| p.name.as_str() == name)
            .map(|p| Identity {
                tenant: p.tenant.clone(),
                person: p.name.clone(),
                roles: p.roles.clone(),
            })
            .ok_or_else(|| DirectoryError::UnknownPerson(name.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEOPLE: &str = r#"
        [[people]]
        name = "dana"
        tenant = "acme"
        roles = ["finance"]

        [[people]]
        name = "ben"
        tenant = "acme"
    "#;

    #[test]
    fn a_known_name_becomes_an_identity_with_its_roles() {
        let directory = Directory::from_toml(PEOPLE).unwrap();
        let dana = directory.identify("dana").unwrap();
        assert_eq!(dana.tenant.as_str(), "acme");
        assert!(dana.has_role(&Role::parse("finance").unwrap()));
        assert!(directory.identify("ben").unwrap().roles.is_empty());
    }

    #[test]
    fn an_unknown_name_is_refused() {
        let directory = Directory::from_toml(PEOPLE).unwrap();
        assert_eq!(
            directory.identify("mallory"),
            Err(DirectoryError::UnknownPerson("mallory".into()))
        );
    }

    #[test]
    fn a_name_listed_twice_or_an_unknown_field_is_invalid() {
        let twice = format!("{PEOPLE}\n[[people]]\nname = \"dana\"\ntenant = \"other\"\n");
        assert!(matches!(
            Directory::from_toml(&twice),
            Err(DirectoryError::Invalid(_))
        ));
        let extra = "[[people]]\nname = \"x\"\ntenant = \"t\"\nboss = true\n";
        assert!(matches!(
            Directory::from_toml(extra),
            Err(DirectoryError::Invalid(_))
        ));
    }
}
