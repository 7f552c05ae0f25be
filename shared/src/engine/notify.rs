//! Notices through the outbox: written in the transaction that opens an approval or marks its
//! reminder, posted once that commits, retried with backoff. Each is claimed (compare-and-set on
//! its item version, moving it past a lease) before it is posted, so two processes never post
//! the same notice at once; a process that dies after posting and before recording it leaves
//! the notice to be posted again after the lease, with the same idempotency key.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::records::{NotifyMessage, OutboxEntry, OutboxMessage, Stored, Tx, keys};
use super::{Engine, EngineError};
use crate::domain::approval::{Approval, ApprovalStatus};
use crate::domain::audit::{AuditEntry, AuditEvent};
use crate::domain::identity::Actor;
use crate::domain::ids::{ApprovalId, RunId, TenantId};
use crate::domain::money::Amount;
use crate::domain::notice::{ActionOutcome, Notice, NoticeKind, Posted};
use crate::ports::notifier::{Notifier, NotifyError};
use crate::ports::store::{Condition, StoreError};

/// Where the messages a notice posted are kept, with the approval: `POSTED#<outbox id>`.
const POSTED_PREFIX: &str = "POSTED#";

/// How long before an approval's deadline its reminder goes out, unless configured otherwise.
pub const DEFAULT_REMIND_BEFORE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Attempts to post one notice before it is given up on and recorded as failed: with the
/// delays below, about two hours of trying.
pub const MAX_NOTICE_ATTEMPTS: u32 = 8;

/// How long a claimed notice belongs to the process posting it: well past a post's timeout.
const NOTICE_LEASE: Duration = Duration::minutes(2);
/// Notices posted at once; each batch finishes well within the lease.
const POSTS_AT_ONCE: usize = 8;
const FIRST_RETRY: Duration = Duration::minutes(1);
const LONGEST_RETRY: Duration = Duration::hours(1);

pub(super) fn default_lead() -> Duration {
    Duration::from_std(DEFAULT_REMIND_BEFORE).expect("an hour fits")
}

/// The wait after `failed` failed attempts: 1, 2, 4, … minutes, at most an hour.
pub(super) fn retry_delay(failed: u32) -> Duration {
    let doublings = failed.saturating_sub(1).min(10);
    (FIRST_RETRY * 2_i32.pow(doublings)).min(LONGEST_RETRY)
}

/// What became of the notices one call posted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NoticeReport {
    /// Posted and recorded as `notified`.
    pub sent: usize,
    /// Failed this time; each waits for its next attempt.
    pub retrying: usize,
    /// Given up on and recorded as `notification_failed`.
    pub failed: usize,
}

impl NoticeReport {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    pub(super) fn add(&mut self, other: NoticeReport) {
        self.sent += other.sent;
        self.retrying += other.retrying;
        self.failed += other.failed;
    }
}

/// A notice this process holds the claim on, at item version `ver`.
struct Claimed {
    outbox: OutboxEntry,
    message: NotifyMessage,
    ver: u64,
    notice: Notice,
}

enum Settled {
    Sent,
    Retrying,
    Failed,
    /// The claim lapsed and another process took the notice over.
    Lost,
}

impl Engine {
    /// Whether notices go anywhere: without a destination, none are written.
    pub(super) fn notifies(&self) -> bool {
        self.notifier
            .as_ref()
            .is_some_and(|notifier| !notifier.destinations().is_empty())
    }

    /// When the reminder of this approval is due, if reminders go out at all.
    pub(super) fn reminder_at(&self, approval: &Approval) -> Option<DateTime<Utc>> {
        if !self.notifies() {
            return None;
        }
        approval.reminder_at(self.remind_before)
    }

    /// Writes one notice per destination into the transaction that calls for it.
    pub(super) fn notify_later(
        &self,
        tx: &mut Tx,
        approval: &Approval,
        notice: NoticeKind,
        now: DateTime<Utc>,
    ) {
        self.notice_later(
            tx,
            (&approval.tenant, &approval.run_id, &approval.id),
            notice,
            now,
        );
    }

    /// Writes an outcome notice for each destination that updates its messages in place, into
    /// the transaction that decides, expires, supersedes or cancels an approval, or records
    /// what its action did: the update is never lost and never sent before the change is stored.
    pub(super) fn follow_up_later(
        &self,
        tx: &mut Tx,
        of: (&TenantId, &RunId, &ApprovalId),
        now: DateTime<Utc>,
    ) {
        self.notice_later(tx, of, NoticeKind::Outcome, now);
    }

    fn notice_later(
        &self,
        tx: &mut Tx,
        (tenant, run_id, approval_id): (&TenantId, &RunId, &ApprovalId),
        notice: NoticeKind,
        now: DateTime<Utc>,
    ) {
        let Some(notifier) = &self.notifier else {
            return;
        };
        for destination in notifier.destinations() {
            if notice == NoticeKind::Outcome && !destination.follows_up {
                continue;
            }
            let message = NotifyMessage {
                approval_id: approval_id.clone(),
                notice,
                destination: destination.id,
                label: destination.label,
                attempts: 0,
                last_error: None,
            };
            tx.outbox(
                self.index_shards,
                tenant,
                run_id,
                OutboxMessage::Notify(message),
                now,
            );
        }
    }

    /// Posts notices a few at a time: claims each of a batch, posts the claimed ones together,
    /// then records what became of each. A claim is held only while its own batch posts.
    pub(super) async fn post_notices(&self, entries: Vec<Stored<OutboxEntry>>) -> NoticeReport {
        let mut report = NoticeReport::default();
        if entries.is_empty() {
            return report;
        }
        let Some(notifier) = self.notifier.clone() else {
            tracing::warn!(
                notices = entries.len(),
                "notices wait in the outbox, but this process has no notifier"
            );
            return report;
        };
        let mut entries = entries.into_iter().peekable();
        while entries.peek().is_some() {
            let batch: Vec<_> = entries.by_ref().take(POSTS_AT_ONCE).collect();
            let batch = self.post_batch(&notifier, batch).await;
            report.add(batch);
        }
        report
    }

    async fn post_batch(
        &self,
        notifier: &Arc<dyn Notifier>,
        entries: Vec<Stored<OutboxEntry>>,
    ) -> NoticeReport {
        let mut claimed = Vec::new();
        for stored in entries {
            let id = stored.value.id.clone();
            match self.claim_notice(stored).await {
                Ok(Some(claim)) => claimed.push(claim),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(outbox = %id, %error, "not claimed; the sweep will try again")
                }
            }
        }

        let mut sends = JoinSet::new();
        for (n, claim) in claimed.iter().enumerate() {
            let notifier = notifier.clone();
            let destination = claim.message.destination.clone();
            let notice = claim.notice.clone();
            let span = tracing::info_span!(
                "notify",
                outbox = %claim.outbox.id,
                approval_id = %claim.message.approval_id,
                notice = %claim.message.notice,
                destination = %claim.message.label,
            );
            sends.spawn(
                async move { (n, notifier.send(&destination, &notice).await) }.instrument(span),
            );
        }
        let mut results: Vec<Option<Result<Option<Posted>, NotifyError>>> =
            vec![None; claimed.len()];
        while let Some(joined) = sends.join_next().await {
            match joined {
                Ok((n, result)) => results[n] = Some(result),
                Err(error) => tracing::error!(%error, "a notice's post stopped"),
            }
        }

        let mut report = NoticeReport::default();
        for (claim, result) in claimed.into_iter().zip(results) {
            let result = result.unwrap_or_else(|| {
                Err(NotifyError::Transient(
                    "the post stopped before it finished".into(),
                ))
            });
            let id = claim.outbox.id.clone();
            match self.settle_notice(claim, result).await {
                Ok(Settled::Sent) => report.sent += 1,
                Ok(Settled::Retrying) => report.retrying += 1,
                Ok(Settled::Failed) => report.failed += 1,
                Ok(Settled::Lost) => {}
                Err(error) => {
                    tracing::warn!(outbox = %id, %error, "not recorded; the notice may be posted again after its lease")
                }
            }
        }
        report
    }

    /// Takes a notice for this process: `None` if another process holds it, or if its approval
    /// no longer waits (then nobody needs telling, and the notice is dropped).
    async fn claim_notice(
        &self,
        stored: Stored<OutboxEntry>,
    ) -> Result<Option<Claimed>, EngineError> {
        let OutboxMessage::Notify(message) = &stored.value.message;
        let outbox = &stored.value;
        let (pk, sk) = outbox.key();
        let now = self.now();
        let outcome = message.notice == NoticeKind::Outcome;
        let approval = self
            .load_approval(&outbox.tenant, &message.approval_id)
            .await?
            .map(|stored| stored.value)
            .filter(|a| {
                outcome || (a.status == ApprovalStatus::AwaitingApproval && !a.is_overdue(now))
            });
        // An outcome updates the messages posted about the approval; with none, there is
        // nothing to update.
        let posted = match (&approval, outcome) {
            (Some(a), true) => self.posted_about(a, &message.destination).await?,
            _ => Vec::new(),
        };
        let approval = approval.filter(|_| !outcome || !posted.is_empty());
        let Some(approval) = approval else {
            let mut tx = Tx::new();
            tx.delete(pk, sk, Condition::VersionIs(stored.ver));
            match self.commit(tx).await {
                Ok(_) => {
                    tracing::info!(outbox = %outbox.id, approval_id = %message.approval_id, notice = %message.notice, "dropped: the approval no longer waits, or no message of it was posted")
                }
                Err(StoreError::ConditionFailed { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            return Ok(None);
        };

        let mut tx = Tx::new();
        let lease = keys::outbox(self.index_shards, now + NOTICE_LEASE, outbox.id.as_str());
        tx.update(pk, sk, Some(lease), outbox, stored.ver);
        match self.commit(tx).await {
            Ok(_) => {}
            Err(StoreError::ConditionFailed { .. }) => return Ok(None),
            Err(error) => return Err(error.into()),
        }
        let policy = self.policy_of(&approval.tenant, &approval.agent).ok();
        let amount = policy
            .and_then(|policy| policy.amount_field(&approval.tool))
            .and_then(|field| approval.args.int(field))
            .and_then(|cents| Amount::from_cents(cents).ok());
        let editable = policy
            .and_then(|policy| policy.lowerable_field(&approval.tool))
            .is_some();
        let action = match outcome {
            true => self
                .load_action(
                    &approval.tenant,
                    &approval.run_id,
                    &approval.action_id,
                    approval.action_version,
                )
                .await?
                .map(|stored| ActionOutcome {
                    status: stored.value.status,
                    result: stored.value.result.map(|r| r.content),
                }),
            false => None,
        };
        let notice = Notice {
            key: outbox.id.to_string(),
            kind: message.notice,
            approval,
            amount,
            editable,
            posted,
            action,
        };
        Ok(Some(Claimed {
            outbox: outbox.clone(),
            message: message.clone(),
            ver: stored.ver + 1,
            notice,
        }))
    }

    /// The messages `destination` posted about an approval, oldest first.
    async fn posted_about(
        &self,
        approval: &Approval,
        destination: &str,
    ) -> Result<Vec<Posted>, EngineError> {
        let pk = keys::approval_pk(&approval.tenant, &approval.id);
        let page = self.store.query(&pk, POSTED_PREFIX, None, 100).await?;
        let mut posted = Vec::new();
        for item in &page.items {
            let message: Posted = super::records::decode(item)?.value;
            if message.destination == destination {
                posted.push(message);
            }
        }
        Ok(posted)
    }

    /// Records a post: sent (the entry goes, `notified` is written, in one transaction), to be
    /// tried again later, or given up on (`notification_failed`). Each compare-and-set on the
    /// claim, so a process whose claim lapsed records nothing.
    async fn settle_notice(
        &self,
        claim: Claimed,
        result: Result<Option<Posted>, NotifyError>,
    ) -> Result<Settled, EngineError> {
        let Claimed {
            mut outbox,
            mut message,
            ver,
            ..
        } = claim;
        let now = self.now();
        let (pk, sk) = outbox.key();
        let notifier = Actor::system("notifier");
        let mut tx = Tx::new();
        let settled = match result {
            Ok(posted) => {
                tx.delete(pk, sk, Condition::VersionIs(ver));
                // A message an outcome will update: kept with the approval.
                if let Some(posted) = posted.filter(|_| message.notice != NoticeKind::Outcome) {
                    tx.upsert(
                        keys::approval_pk(&outbox.tenant, &message.approval_id),
                        format!("{POSTED_PREFIX}{}", outbox.id),
                        &posted,
                    );
                }
                let event = AuditEvent::Notified {
                    approval_id: message.approval_id.clone(),
                    notice: message.notice.as_str().into(),
                    destination: message.label.clone(),
                };
                tx.audit(
                    &outbox.tenant,
                    AuditEntry::new(&outbox.run_id, notifier, event, now),
                );
                Settled::Sent
            }
            Err(error) => {
                message.attempts += 1;
                let permanent = matches!(error, NotifyError::Permanent(_));
                if permanent || message.attempts >= MAX_NOTICE_ATTEMPTS {
                    tracing::warn!(outbox = %outbox.id, attempts = message.attempts, %error, "notice given up on");
                    tx.delete(pk, sk, Condition::VersionIs(ver));
                    let event = AuditEvent::NotificationFailed {
                        approval_id: message.approval_id.clone(),
                        notice: message.notice.as_str().into(),
                        destination: message.label.clone(),
                        attempts: message.attempts,
                        error: error.to_string(),
                    };
                    tx.audit(
                        &outbox.tenant,
                        AuditEntry::new(&outbox.run_id, notifier, event, now),
                    );
                    Settled::Failed
                } else {
                    let next = now + retry_delay(message.attempts);
                    tracing::warn!(outbox = %outbox.id, attempts = message.attempts, %error, next = %keys::sortable(next), "notice not delivered; trying again later");
                    message.last_error = Some(error.to_string());
                    outbox.message = OutboxMessage::Notify(message);
                    tx.update(
                        pk,
                        sk,
                        Some(keys::outbox(self.index_shards, next, outbox.id.as_str())),
                        &outbox,
                        ver,
                    );
                    Settled::Retrying
                }
            }
        };
        match self.commit(tx).await {
            Ok(_) => Ok(settled),
            Err(StoreError::ConditionFailed { .. }) => {
                tracing::warn!(outbox = %outbox.id, "the claim lapsed and another process took this notice over");
                Ok(Settled::Lost)
            }
            Err(error) => Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_wait_longer_each_time_up_to_an_hour() {
        let waits: Vec<i64> = (1..=MAX_NOTICE_ATTEMPTS)
            .map(|n| retry_delay(n).num_minutes())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(retry_delay(u32::MAX).num_minutes(), 60);
    }
}
