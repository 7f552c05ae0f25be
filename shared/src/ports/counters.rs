//! The counts the engine keeps as it commits (decisions, executions, policy rulings), and the
//! port that keeps them: the embedded store adds them in the transaction that records what
//! they count, so every process sharing its file counts into one total that survives a
//! restart; on DynamoDB, where a counter item would cost a write unit and be one hot key, the
//! store reports each count as a metric line once its transaction commits ([`emf`]); a store
//! without the port counts nothing.
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

shown_by_serde_name!(DecisionOutcome, ExecutionOutcome, RuleMode);

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
}

impl Series {
    /// Its stored name and label.
    pub fn key(self) -> (&'static str, String) {
        match self {
            Series::Decisions(outcome) => ("decisions", outcome.as_str().into()),
            Series::DecidedWithin(bucket) => ("decided_within", bucket.to_string()),
            Series::Executions(outcome) => ("executions", outcome.as_str().into()),
            Series::Rulings(outcome, mode) => ("rulings", format!("{}/{mode}", outcome.name())),
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
            _ => None,
        }
    }
}

/// One thing counted, of one agent of one tenant, with the seconds it took where it is timed.
#[derive(Debug, Clone, PartialEq)]
pub struct Count {
    pub tenant: TenantId,
    pub agent: AgentName,
    pub series: Series,
    pub seconds: f64,
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
        let mut all: Vec<Series> = DecisionOutcome::ALL.map(Series::Decisions).into();
        all.extend((0..=DECISION_BUCKETS.len()).map(Series::DecidedWithin));
        all.extend(ExecutionOutcome::ALL.map(Series::Executions));
        for verdict in VerdictKind::ALL {
            all.extend(RuleMode::ALL.map(|mode| Series::Rulings(verdict, mode)));
        }
        for series in all {
            let (name, label) = series.key();
            assert_eq!(Series::parse(name, &label), Some(series), "{name} {label}");
        }
        assert_eq!(Series::parse("decided_within", "13"), None);
        assert_eq!(Series::parse("rulings", "allow"), None);
        assert_eq!(Series::parse("tokens", "in"), None);
    }
}
