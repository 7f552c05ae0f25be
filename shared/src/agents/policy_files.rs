//! A definition's policy as errors name it: the manifest and each Cedar file it names, where
//! it was read from. Its rules are checked against the agent's tools here, once they are known:
//! at build, or once an MCP server has listed them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::DefinitionError;
use crate::domain::policy::validate::ToolShape;
use crate::domain::policy::{Policy, PolicyError};

/// A policy's files as errors name them: its manifest, and each Cedar file it names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyFiles {
    pub manifest: String,
    /// Each Cedar file, by the name the manifest gives it.
    pub cedar: BTreeMap<String, String>,
}

impl PolicyFiles {
    /// A policy's error in the definition's words: the Cedar file's place or the manifest's,
    /// its line or field, and what is wrong.
    pub fn error(&self, error: PolicyError) -> DefinitionError {
        let file = error
            .file
            .as_ref()
            .and_then(|name| self.cedar.get(name))
            .unwrap_or(&self.manifest);
        DefinitionError::new(file, &error.at, error.message)
    }

    /// Checks every rule of `policy` against the agent's tools (each one's name and input
    /// schema) and the roles people hold, where the process knows them.
    pub fn check(
        &self,
        policy: &Policy,
        tools: &[(String, Value)],
        roles: Option<&BTreeSet<String>>,
    ) -> Result<(), DefinitionError> {
        policy
            .validate(&ToolShape::of(tools), roles)
            .map_err(|e| self.error(e))
    }
}
