//! Who is acting: always from authentication, never from a request body.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ids::{PersonId, Role, TenantId};

/// An authenticated person, as the engine sees them at the moment they act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub tenant: TenantId,
    pub person: PersonId,
    pub roles: BTreeSet<Role>,
    /// What else authentication says of them (a token's other claims, a person's `claims` in
    /// the people file), as policy rules read it: `principal.getTag("department")`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, String>,
}

/// The most claims an identity carries, and the longest name and value of one: a token's
/// claims ride on every run it starts. Claims past these are left out.
pub const MAX_CLAIMS: usize = 32;
pub const MAX_CLAIM_NAME: usize = 64;
pub const MAX_CLAIM_VALUE: usize = 256;

impl Identity {
    pub fn new(tenant: TenantId, person: PersonId, roles: BTreeSet<Role>) -> Self {
        Self {
            tenant,
            person,
            roles,
            claims: BTreeMap::new(),
        }
    }

    pub fn has_role(&self, role: &Role) -> bool {
        self.roles.contains(role)
    }

    /// With these claims as well, within [`MAX_CLAIMS`] and their lengths: a claim too long,
    /// or one past the count, is left out.
    pub fn with_claims(mut self, claims: impl IntoIterator<Item = (String, String)>) -> Self {
        self.claims = bounded_claims(claims);
        self
    }

    /// What policy rules read of this person when they ask for a run or a call.
    pub fn standing(&self) -> Standing {
        Standing {
            roles: self.roles.clone(),
            claims: self.claims.clone(),
        }
    }
}

/// Claims within [`MAX_CLAIMS`], [`MAX_CLAIM_NAME`] and [`MAX_CLAIM_VALUE`].
fn bounded_claims(claims: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
    claims
        .into_iter()
        .filter(|(name, value)| {
            !name.is_empty() && name.len() <= MAX_CLAIM_NAME && value.len() <= MAX_CLAIM_VALUE
        })
        .take(MAX_CLAIMS)
        .collect()
}

/// What authentication said of a run's requester when the run started (or a gated call was
/// made): the roles and claims policy rules read as `principal`, kept with the run so that
/// every call of it is decided on the same facts, whichever process decides it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub roles: BTreeSet<Role>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, String>,
}

impl Standing {
    pub fn is_empty(&self) -> bool {
        self.roles.is_empty() && self.claims.is_empty()
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
    /// What a token would say of them besides their roles (`department = "finance"`), as
    /// policy rules read it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, String>,
}

impl Person {
    fn identity(&self) -> Identity {
        Identity::new(self.tenant.clone(), self.name.clone(), self.roles.clone())
            .with_claims(self.claims.clone())
    }
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
            if bounded_claims(person.claims.clone()).len() != person.claims.len() {
                return Err(DirectoryError::Invalid(format!(
                    "{}'s claims: at most {MAX_CLAIMS}, each name 1 to {MAX_CLAIM_NAME} bytes and each value at most {MAX_CLAIM_VALUE}",
                    person.name
                )));
            }
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

    /// Every role some person holds, by name.
    pub fn roles(&self) -> BTreeSet<String> {
        self.people
            .iter()
            .flat_map(|person| person.roles.iter().map(|role| role.to_string()))
            .collect()
    }

    /// The person a Slack user id belongs to, as an identity with their tenant and roles.
    pub fn by_slack_user(&self, user: &str) -> Option<Identity> {
        self.people
            .iter()
            .find(|p| p.slack.as_deref() == Some(user))
            .map(Person::identity)
    }

    pub fn identify(&self, name: &str) -> Result<Identity, DirectoryError> {
        self.people
            .iter()
            .find(|p| p.name.as_str() == name)
            .map(Person::identity)
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
