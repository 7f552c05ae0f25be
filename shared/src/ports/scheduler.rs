//! One-time wake-ups for an approval's reminder and deadline. The recurring sweep is the
//! safety net, so a schedule that is lost delays work but never loses it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::ids::{ApprovalId, TenantId};
use crate::domain::names::serde_name;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wake {
    Reminder,
    Deadline,
}

impl Wake {
    pub fn as_str(self) -> &'static str {
        serde_name(&self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the scheduler is unavailable: {0}")]
pub struct SchedulerError(pub String);

#[async_trait]
pub trait Scheduler: Send + Sync {
    async fn schedule(
        &self,
        tenant: &TenantId,
        approval: &ApprovalId,
        wake: Wake,
        at: DateTime<Utc>,
    ) -> Result<(), SchedulerError>;

    async fn unschedule(
        &self,
        tenant: &TenantId,
        approval: &ApprovalId,
        wake: Wake,
    ) -> Result<(), SchedulerError>;
}

/// No one-time schedules: the sweep alone finds what is due (the embedded mode).
pub struct SweepOnly;

#[async_trait]
impl Scheduler for SweepOnly {
    async fn schedule(
        &self,
        _: &TenantId,
        _: &ApprovalId,
        _: Wake,
        _: DateTime<Utc>,
    ) -> Result<(), SchedulerError> {
        Ok(())
    }

    async fn unschedule(
        &self,
        _: &TenantId,
        _: &ApprovalId,
        _: Wake,
    ) -> Result<(), SchedulerError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Wake;

    #[test]
    fn a_wake_reads_as_its_schedule_names_it() {
        assert_eq!(Wake::Deadline.as_str(), "deadline");
    }
}
