//! The rules of a call from outside that only its caller can break: reusing its id for another
//! call, claiming a caller-run call that is not the caller's to run, reporting its outcome twice.

use super::action::ActionStatus;

/// Why the gate refuses what a caller asks of a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateRefusal {
    /// The caller's id for a call names an earlier call of another tool or other arguments.
    #[error(
        "call id {call_id} was already used for another call (another tool or other arguments); give each call its own id"
    )]
    CallIdReused { call_id: String },
    /// Only the person who proposed the call may claim it or report its outcome.
    #[error("only the requester of call {call} may claim it or report its outcome")]
    NotRequester { call: String },
    /// A call that is not approved and waiting for its caller to run it.
    #[error("call {call} is {status}: only an approved call the caller runs can be claimed")]
    NotClaimable { call: String, status: String },
    /// Another claimant holds the call.
    #[error("call {call} is claimed by another claimant; it runs once, there")]
    Claimed { call: String },
    /// An outcome was already recorded, and this report says something else.
    #[error("call {call} already has its outcome ({status}); a different report is refused")]
    OutcomeRecorded { call: String, status: String },
}

/// Whether a claimed call's status lets its claimant report an outcome: running under the
/// claim, or already handed to the recovery owner as unknown (the late report is the answer).
pub fn takes_outcome(status: ActionStatus) -> bool {
    matches!(status, ActionStatus::Executing | ActionStatus::Unknown)
}
