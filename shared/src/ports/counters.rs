//! The counts the engine keeps as it commits (decisions, executions, policy rulings, model
//! turns and their tokens), and the port that keeps them: the embedded store adds them in the
//! transaction that records what they count, so every process sharing its file counts into one
//! total that survives a restart; on DynamoDB, where a counter item would cost a write unit and
//! be one hot key, the store reports each count as a metric line once its transaction commits
//! ([`emf`]); a store without the port counts nothing. What no transaction records (a failed
//! model request, a failed delivery of a queued message) is counted on its own.
//!
//! [`emf`]: crate::adapters::emf

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::domain::ids::{AgentName, TenantId};
use crate::domain::names::shown_by_serde_name;
use crate::domain::policy::VerdictKind;
use crate::ports::store::{Refused, StoreError, Write};

/// What became of an approval people were asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionOutcome {
    Approved,
    /// A reviewer approved a changed version: it superseded the one asked about.
    Edited,
    Rejected,
    Expired,
}

/// What a call that ran came back with, as first recorded (a later reconcile is not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionOutcome {
    Succeeded,
    Failed,
    Unknown,
}

/// Whether a ruling was enforced, or what the policy's log-only rules would have made of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleMode {
    Enforce,
    LogOnly,
}

/// How a model request ended, as the model port answered it (its own retries are inside one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelOutcome {
    Ok,
    Error,
}

/// Which of a model turn's tokens: those it read or those it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    Input,
    Output,
}

shown_by_serde_name!(
    DecisionOutcome,
    ExecutionOutcome,
    RuleMode,
    ModelOutcome,
    TokenKind
);

impl DecisionOutcome {
    pub const ALL: [DecisionOutcome; 4] = [
        DecisionOutcome::Approved,
        DecisionOutcome::Edited,
        DecisionOutcome::Rejected,
        DecisionOutcome::Expired,
    ];
}

impl ExecutionOutcome {
    pub const ALL: [ExecutionOutcome; 3] = [
        ExecutionOutcome::Succeeded,
        ExecutionOutcome::Failed,
        ExecutionOutcome::Unknown,
    ];
}

impl RuleMode {
    pub const ALL: [RuleMode; 2] = [RuleMode::Enforce, RuleMode::LogOnly];
}

impl ModelOutcome {
    pub const ALL: [ModelOutcome; 2] = [ModelOutcome::Ok, ModelOutcome::Error];
}

impl TokenKind {
    pub const ALL: [TokenKind; 2] = [TokenKind::Input, TokenKind::Output];
}

/// The upper bounds, in seconds, of the buckets that time an approval from its creation to its
/// decision: from a person at their desk (a minute) to the longest time to decide (90 days).
pub const DECISION_BUCKETS: [f64; 12] = [
    10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 259200.0, 604800.0,
];

/// One series a count adds to. Its stored name and label are fixed text, so counts written by
/// one release are read by the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    Decisions(DecisionOutcome),
    /// Decisions that came within the bucket at this index of [`DECISION_BUCKETS`] and no
    /// earlier one; past the last, `DECISION_BUCKETS.len()`.
    DecidedWithin(usize),
    Executions(ExecutionOutcome),
    Rulings(VerdictKind, RuleMode),
    ModelRequests(ModelOutcome),
    /// A model turn's tokens: a count of them, not of turns.
    ModelTokens(TokenKind),
    /// A queued resume or drive message whose handling failed, to be delivered again.
    ResumeFailures,
}

impl Series {
    /// Every series there is, each bucket of the time to decide its own.
    pub fn all() -> Vec<Series> {
        let mut all: Vec<Series> = DecisionOutcome::ALL.map(Series::Decisions).into();
        all.extend((0..=DECISION_BUCKETS.len()).map(Series::DecidedWithin));
        all.extend(ExecutionOutcome::ALL.map(Series::Executions));
        for verdict in VerdictKind::ALL {
            all.extend(RuleMode::ALL.map(|mode| Series::Rulings(verdict, mode)));
        }
        all.extend(ModelOutcome::ALL.map(Series::ModelRequests));
        all.extend(TokenKind::ALL.map(Series::ModelTokens));
        all.push(Series::ResumeFailures);
        all
    }

    /// Its stored name and label.
    pub fn key(self) -> (&'static str, String) {
        match self {
            Series::Decisions(outcome) => ("decisions", outcome.as_str().into()),
            Series::DecidedWithin(bucket) => ("decided_within", bucket.to_string()),
            Series::Executions(outcome) => ("executions", outcome.as_str().into()),
            Series::Rulings(outcome, mode) => ("rulings", format!("{}/{mode}", outcome.name())),
            Series::ModelRequests(outcome) => ("model_requests", outcome.as_str().into()),
            Series::ModelTokens(kind) => ("model_tokens", kind.as_str().into()),
            Series::ResumeFailures => ("resume_failures", String::new()),
        }
    }

    /// The series stored under `name` and `label`; `None` for one this release does not know.
    pub fn parse(name: &str, label: &str) -> Option<Self> {
        let quoted = |text: &str| serde_json::Value::String(text.into());
        match name {
            "decisions" => serde_json::from_value(quoted(label))
                .ok()
                .map(Series::Decisions),
            "decided_within" => label
                .parse()
                .ok()
                .filter(|bucket| *bucket <= DECISION_BUCKETS.len())
                .map(Series::DecidedWithin),
            "executions" => serde_json::from_value(quoted(label))
                .ok()
                .map(Series::Executions),
            "rulings" => {
                let (outcome, mode) = label.split_once('/')?;
                Some(Series::Rulings(
                    serde_json::from_value(quoted(outcome)).ok()?,
                    serde_json::from_value(quoted(mode)).ok()?,
                ))
            }
            "model_requests" => serde_json::from_value(quoted(label))
                .ok()
                .map(Series::ModelRequests),
            "model_tokens" => serde_json::from_value(quoted(label))
                .ok()
                .map(Series::ModelTokens),
            "resume_failures" if label.is_empty() => Some(Series::ResumeFailures),
            _ => None,
        }
    }
}

/// What one agent of one tenant adds to a series: how many (one thing, or a turn's tokens),
/// with the seconds it took where it is timed.
#[derive(Debug, Clone, PartialEq)]
pub struct Count {
    pub tenant: TenantId,
    pub agent: AgentName,
    pub series: Series,
    pub n: u64,
    pub seconds: f64,
}

impl Count {
    /// One thing counted, untimed.
    pub fn one(tenant: &TenantId, agent: &AgentName, series: Series) -> Self {
        Self {
            tenant: tenant.clone(),
            agent: agent.clone(),
            series,
            n: 1,
            seconds: 0.0,
        }
    }
}

/// A series as kept: how many were counted, and their seconds together.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub tenant: TenantId,
    pub agent: AgentName,
    pub series: Series,
    pub n: u64,
    pub seconds: f64,
}

/// A store that keeps counts in its own transactions.
#[async_trait]
pub trait Counters: Send + Sync {
    /// [`ItemStore::transact_or_found`], adding `counts` in the same transaction: a count is
    /// kept exactly when what it counts commits, once, whichever process commits it.
    ///
    /// [`ItemStore::transact_or_found`]: crate::ports::store::ItemStore::transact_or_found
    async fn transact_counting(&self, writes: Vec<Write>, counts: &[Count]) -> Result<(), Refused>;

    /// Keeps `counts` of what no transaction records (a failed delivery, a model request): on
    /// their own, since nothing else commits with them.
    async fn count(&self, counts: &[Count]) -> Result<(), StoreError>;

    /// Every series kept, of `tenant` or of all tenants.
    async fn kept(&self, tenant: Option<&TenantId>) -> Result<Vec<Kept>, StoreError>;

    /// Whether [`Counters::kept`] reads the counts back: a store that reports each count as it
    /// commits (metric lines for CloudWatch, on DynamoDB) has none to read.
    fn reads_back(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_reads_back_from_its_stored_name_and_label() {
        for series in Series::all() {
            let (name, label) = series.key();
            assert_eq!(Series::parse(name, &label), Some(series), "{name} {label}");
        }
        assert_eq!(Series::parse("decided_within", "13"), None);
        assert_eq!(Series::parse("rulings", "allow"), None);
        assert_eq!(Series::parse("tokens", "in"), None);
        assert_eq!(Series::parse("model_tokens", "cached"), None);
        assert_eq!(Series::parse("resume_failures", "x"), None);
    }
}
