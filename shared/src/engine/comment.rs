//! Comments: a person of the organisation remarks on an approval without deciding it (a
//! question to the requester, say). The comment is kept on the approval, so the page shows it,
//! and recorded in the audit log, in one transaction.

use super::records::Tx;
use super::snapshot::{Shown, Snapshot};
use super::{CAS_ATTEMPTS, Engine, EngineError};
use crate::domain::approval::Comment;
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::budget;
use crate::domain::identity::{Actor, Identity};
use crate::domain::ids::ApprovalId;
use crate::ports::store::StoreError;

/// The longest comment, in characters.
pub const MAX_COMMENT: usize = 2_000;
/// Comments one approval holds at most: they travel with it on every read.
pub const MAX_COMMENTS: usize = 100;
/// Comments one person leaves on one approval at most, so no one member fills it for everyone.
pub const MAX_COMMENTS_PER_PERSON: usize = 20;

impl Engine {
    /// Adds `text` as `who`'s comment on an approval of their tenant, whatever its status.
    /// Anyone who may read the approval may comment; a comment decides nothing. The approval
    /// comes back as written, with its snapshot: a decision the commenter then makes from it
    /// needs no read.
    pub async fn comment(
        &self,
        who: &Identity,
        approval_id: &ApprovalId,
        text: &str,
    ) -> Result<Shown, EngineError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(EngineError::BadInput("a comment needs some text".into()));
        }
        if text.chars().count() > MAX_COMMENT {
            return Err(EngineError::BadInput(format!(
                "a comment has at most {MAX_COMMENT} characters"
            )));
        }
        for _ in 0..CAS_ATTEMPTS {
            let what = || format!("approval {approval_id}");
            let stored = self.load_approval(&who.tenant, approval_id).await?;
            let stored = stored.ok_or_else(|| EngineError::not_found(what()))?;
            self.readable(&who.tenant, &stored.value.agent, what())?;
            let mut approval = stored.value;
            if approval.comments.len() >= MAX_COMMENTS {
                return Err(EngineError::TooManyComments(format!(
                    "approval {approval_id} already has {MAX_COMMENTS} comments, the most it holds"
                )));
            }
            let own = approval.comments.iter().filter(|c| c.by == who.person);
            if own.count() >= MAX_COMMENTS_PER_PERSON {
                return Err(EngineError::TooManyComments(format!(
                    "{} already left {MAX_COMMENTS_PER_PERSON} comments on approval {approval_id}, \
                     the most one person may",
                    who.person
                )));
            }
            let now = self.now();
            approval.comments.push(Comment {
                by: who.person.clone(),
                text: text.to_string(),
                at: now,
            });
            // Comments travel in the approval's item: together they keep to their share of it.
            let size = serde_json::to_string(&approval.comments).map_or(0, |c| c.len());
            if size > budget::COMMENTS {
                return Err(EngineError::TooManyComments(format!(
                    "approval {approval_id}'s comments are full: with this one they would take {}, \
                     at most {}",
                    budget::Size(size),
                    budget::Size(budget::COMMENTS)
                )));
            }
            let mut tx = Tx::new();
            // The approval as written here: the commenter may decide from it without a read.
            let snapshot = Snapshot::of(tx.update_approval(&approval, stored.ver)).encode();
            let event = AuditEvent::Commented {
                approval_id: approval.id.clone(),
                text: text.to_string(),
            };
            tx.audit(
                &approval.tenant,
                AuditEntry::new(&approval.run_id, Actor::person(&who.person), event, now),
            );
            match self.commit(tx).await {
                Ok(_) => return Ok(Shown { approval, snapshot }),
                Err(StoreError::ConditionFailed { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(EngineError::Contended)
    }
}
