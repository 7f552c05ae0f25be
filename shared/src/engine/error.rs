//! The engine's errors, each with a stable code and a kind a caller can act on.

use crate::domain::approval::{ApprovalStatus, Refusal};
use crate::domain::gate::GateRefusal;
use crate::domain::identity::DirectoryError;
use crate::domain::run::RunStatus;
use crate::ports::store::StoreError;

/// What a caller should do about an error; the HTTP API maps each to one status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed (400).
    BadInput,
    /// Not allowed for this person (403).
    Forbidden,
    /// Unknown, or another tenant's (404).
    NotFound,
    /// The state moved on: resolved, stale, expired, cancelled (409).
    Conflict,
    /// Policy refuses what was asked (422).
    PolicyRefused,
    /// The store or a dependency failed; trying again later may work (503).
    Unavailable,
    /// This process lacks a setting it needs, such as a model's key: nothing changes until
    /// an operator sets it, so trying again does not help (500).
    NotConfigured,
    /// The caller has as much open as one person may; again once some of it settles (429).
    TooMany,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    BadInput(String),
    #[error("{what} was not found")]
    NotFound { what: String },
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("run {run} is {status}")]
    RunFinished { run: String, status: RunStatus },
    #[error(
        "{who} may not cancel run {run}: only its requester or an approver of its pending approvals may"
    )]
    MayNotCancel { who: String, run: String },
    #[error("{0}")]
    PolicyRefused(String),
    #[error(transparent)]
    Directory(#[from] DirectoryError),
    #[error(transparent)]
    Gate(#[from] GateRefusal),
    #[error("too many concurrent changes to the same records; try again")]
    Contended,
    /// The approval, or the commenter on it, has as many comments as it may hold.
    #[error("{0}")]
    TooManyComments(String),
    /// A call a person must approve, from a requester who already has as many approvals
    /// waiting as one may: not proposed, nobody asked.
    #[error(
        "not proposed: too many open approvals: {requester} has {limit} waiting for a person, \
         the most one requester may; propose it again once reviewers have decided some of \
         them, or cancel the runs that no longer need theirs"
    )]
    TooManyOpenApprovals { requester: String, limit: u32 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("a stored record could not be read: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Unavailable(String),
    /// What this process lacks (a variable named), and what it stops.
    #[error("{0}")]
    NotConfigured(String),
}

impl EngineError {
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        EngineError::NotFound {
            what: what.to_string(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::BadInput(_) => ErrorKind::BadInput,
            EngineError::NotFound { .. } => ErrorKind::NotFound,
            EngineError::Refused(refusal) => match refusal {
                Refusal::OwnRequest { .. } | Refusal::MissingRole { .. } => ErrorKind::Forbidden,
                Refusal::Edit(_) => ErrorKind::PolicyRefused,
                Refusal::EmptyReason | Refusal::WrongChoice { .. } => ErrorKind::BadInput,
                Refusal::AlreadyResolved { .. }
                | Refusal::Superseded { .. }
                | Refusal::StaleVersion { .. }
                | Refusal::Expired { .. }
                | Refusal::AlreadyApprovedBy { .. }
                | Refusal::DecisionIdReused { .. } => ErrorKind::Conflict,
            },
            EngineError::RunFinished { .. }
            | EngineError::Contended
            | EngineError::TooManyComments(_) => ErrorKind::Conflict,
            EngineError::MayNotCancel { .. } => ErrorKind::Forbidden,
            EngineError::TooManyOpenApprovals { .. } => ErrorKind::TooMany,
            EngineError::Gate(GateRefusal::NotRequester { .. }) => ErrorKind::Forbidden,
            EngineError::Gate(_) => ErrorKind::Conflict,
            EngineError::PolicyRefused(_) => ErrorKind::PolicyRefused,
            EngineError::Directory(DirectoryError::UnknownPerson(_)) => ErrorKind::Forbidden,
            EngineError::Directory(DirectoryError::Invalid(_)) => ErrorKind::Unavailable,
            EngineError::Store(StoreError::Invalid(_)) => ErrorKind::BadInput,
            EngineError::Store(_) | EngineError::Corrupt(_) | EngineError::Unavailable(_) => {
                ErrorKind::Unavailable
            }
            EngineError::NotConfigured(_) => ErrorKind::NotConfigured,
        }
    }

    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::BadInput(_) => "bad_input",
            EngineError::NotFound { .. } => "not_found",
            EngineError::Refused(refusal) => match refusal {
                Refusal::OwnRequest { .. } => "own_request",
                Refusal::MissingRole { .. } => "missing_role",
                Refusal::AlreadyResolved {
                    status: ApprovalStatus::Cancelled,
                } => "cancelled",
                Refusal::AlreadyResolved {
                    status: ApprovalStatus::Expired,
                } => "expired",
                Refusal::AlreadyResolved { .. } => "already_decided",
                Refusal::Superseded { .. } => "superseded",
                Refusal::StaleVersion { .. } => "stale_version",
                Refusal::Expired { .. } => "expired",
                Refusal::AlreadyApprovedBy { .. } => "already_approved_by_you",
                Refusal::DecisionIdReused { .. } => "decision_id_reused",
                Refusal::Edit(_) => "edit_refused",
                Refusal::EmptyReason => "reason_required",
                Refusal::WrongChoice { .. } => "wrong_choice",
            },
            EngineError::RunFinished { .. } => "run_finished",
            EngineError::MayNotCancel { .. } => "may_not_cancel",
            EngineError::Gate(refusal) => match refusal {
                GateRefusal::CallIdReused { .. } => "call_id_reused",
                GateRefusal::NotRequester { .. } => "not_requester",
                GateRefusal::NotClaimable { .. } => "not_claimable",
                GateRefusal::Claimed { .. } => "claimed",
                GateRefusal::OutcomeRecorded { .. } => "outcome_recorded",
            },
            EngineError::PolicyRefused(_) => "policy_refused",
            EngineError::Directory(DirectoryError::UnknownPerson(_)) => "unknown_person",
            EngineError::Directory(DirectoryError::Invalid(_)) => "directory_invalid",
            EngineError::Contended => "contended",
            EngineError::TooManyComments(_) => "too_many_comments",
            EngineError::TooManyOpenApprovals { .. } => "too_many_open_approvals",
            EngineError::Store(StoreError::Invalid(_)) => "bad_input",
            EngineError::Store(StoreError::TooLarge { .. }) => "too_large",
            EngineError::Store(StoreError::Throttled(_)) => "throttled",
            EngineError::Store(_) | EngineError::Corrupt(_) | EngineError::Unavailable(_) => {
                "unavailable"
            }
            EngineError::NotConfigured(_) => "not_configured",
        }
    }
}
