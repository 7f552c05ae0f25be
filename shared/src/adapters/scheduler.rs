//! One-time wake-ups on EventBridge Scheduler: `at(...)` schedules that invoke the sweep at an
//! approval's deadline and delete themselves after running.

use async_trait::async_trait;
use aws_sdk_scheduler::Client;
use aws_sdk_scheduler::error::{DisplayErrorContext, SdkError};
use aws_sdk_scheduler::operation::create_schedule::CreateScheduleError;
use aws_sdk_scheduler::operation::delete_schedule::DeleteScheduleError;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, FlexibleTimeWindow, FlexibleTimeWindowMode, Target,
};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::json;

use crate::domain::ids::{ApprovalId, TenantId};
use crate::ports::scheduler::{Scheduler, SchedulerError, Wake};

/// Where one-time schedules live and what they invoke.
#[derive(Debug, Clone)]
pub struct ScheduleTarget {
    pub group: String,
    /// The role EventBridge Scheduler assumes to invoke the target.
    pub role_arn: String,
    /// The sweep function.
    pub target_arn: String,
}

#[derive(Clone)]
pub struct EventBridgeScheduler {
    client: Client,
    target: ScheduleTarget,
}

impl EventBridgeScheduler {
    pub fn new(client: Client, target: ScheduleTarget) -> Self {
        Self { client, target }
    }
}

/// `deadline-ap-…`: at most 64 characters of `[0-9A-Za-z-_.]`, which approval ids always are.
pub fn schedule_name(wake: Wake, approval: &ApprovalId) -> String {
    let name = format!("{}-{approval}", wake.as_str());
    debug_assert!(name.len() <= 64);
    name
}

/// `at(2026-11-30T13:00:01)` in UTC, rounded up to the next whole second so it never fires early.
pub fn at_expression(at: DateTime<Utc>) -> String {
    let second = TimeDelta::seconds(1);
    let rounded = at
        .duration_trunc(second)
        .expect("seconds divide any timestamp");
    let rounded = if rounded < at {
        rounded + second
    } else {
        rounded
    };
    format!("at({})", rounded.format("%Y-%m-%dT%H:%M:%S"))
}

fn failed<E: std::error::Error + 'static, R: std::fmt::Debug>(
    error: SdkError<E, R>,
) -> SchedulerError {
    SchedulerError(DisplayErrorContext(&error).to_string())
}

/// A call's outcome: done when it succeeded or when its error says it was `done_before`.
fn outcome<T, E: std::error::Error + 'static, R: std::fmt::Debug>(
    result: Result<T, SdkError<E, R>>,
    done_before: impl FnOnce(&E) -> bool,
) -> Result<(), SchedulerError> {
    match result {
        Ok(_) => Ok(()),
        Err(SdkError::ServiceError(e)) if done_before(e.err()) => Ok(()),
        Err(error) => Err(failed(error)),
    }
}

#[async_trait]
impl Scheduler for EventBridgeScheduler {
    async fn schedule(
        &self,
        tenant: &TenantId,
        approval: &ApprovalId,
        wake: Wake,
        at: DateTime<Utc>,
    ) -> Result<(), SchedulerError> {
        if at <= Utc::now() {
            // Already due: the next recurring sweep handles it.
            return Ok(());
        }
        let input = json!({"source": "countersign.scheduler", "wake": wake.as_str(), "tenant": tenant, "approval_id": approval});
        let target = Target::builder()
            .arn(&self.target.target_arn)
            .role_arn(&self.target.role_arn)
            .input(input.to_string())
            .build()
            .map_err(|e| SchedulerError(e.to_string()))?;
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| SchedulerError(e.to_string()))?;
        let result = self
            .client
            .create_schedule()
            .name(schedule_name(wake, approval))
            .group_name(&self.target.group)
            .schedule_expression(at_expression(at))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(window)
            .action_after_completion(ActionAfterCompletion::Delete)
            .target(target)
            .send()
            .await;
        // Created by an earlier attempt.
        outcome(result, |e| {
            matches!(e, CreateScheduleError::ConflictException(_))
        })
    }

    async fn unschedule(
        &self,
        _tenant: &TenantId,
        approval: &ApprovalId,
        wake: Wake,
    ) -> Result<(), SchedulerError> {
        let result = self
            .client
            .delete_schedule()
            .name(schedule_name(wake, approval))
            .group_name(&self.target.group)
            .send()
            .await;
        // Never created, already ran (it deletes itself), or deleted before.
        outcome(result, |e| {
            matches!(e, DeleteScheduleError::ResourceNotFoundException(_))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_expression_rounds_up_to_a_whole_second() {
        let at =
            Utc.with_ymd_and_hms(2026, 11, 30, 13, 0, 0).unwrap() + TimeDelta::milliseconds(250);
        assert_eq!(at_expression(at), "at(2026-11-30T13:00:01)");
        let exact = Utc.with_ymd_and_hms(2026, 11, 30, 13, 0, 0).unwrap();
        assert_eq!(at_expression(exact), "at(2026-11-30T13:00:00)");
    }

    #[test]
    fn names_fit_eventbridge_limits() {
        let name = schedule_name(Wake::Deadline, &ApprovalId::generate());
        assert!(name.len() <= 64);
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        );
        assert!(name.starts_with("deadline-ap-"));
    }
}
