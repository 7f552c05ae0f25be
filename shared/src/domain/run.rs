//! An agent run: the conversation so far, and the turn it is paused on.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::conversation::{Block, Message, Speaker, ToolResultText};
use super::identity::Standing;
use super::ids::{ActionId, AgentName, PersonId, RunId, TenantId};
use super::is_zero;
use super::names::serde_name;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    AwaitingApproval,
    Done,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        serde_name(&self)
    }

    pub fn is_finished(self) -> bool {
        matches!(
            self,
            RunStatus::Done | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One call of the paused turn and its result once known. An edit makes a new version of the
/// same action, so the run follows the action id, not a version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldCall {
    pub tool_use_id: String,
    pub action_id: ActionId,
    #[serde(default)]
    pub result: Option<ToolResultText>,
}

/// The turn a run waits on. Results of calls that already ran are held here, so all results
/// of the turn go back to the model together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PausedTurn {
    pub calls: Vec<HeldCall>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("run {run} is {status}, not {expected}")]
    WrongStatus {
        run: RunId,
        status: RunStatus,
        expected: RunStatus,
    },
    #[error("run {run} is not waiting on {action}")]
    NotHeld { run: RunId, action: ActionId },
}

/// How many times the sweep re-drives one run whose driver stopped before it fails it.
pub const MOST_REDRIVES: u32 = 3;

/// Why a drive message does not drive a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotDriven {
    #[error("the run is {0}")]
    Moved(RunStatus),
    #[error("another driver took the run's lease")]
    Taken,
}

/// Why the sweep fails, rather than re-drives, a run whose driver stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotRedriven {
    #[error("no model drives it")]
    NotDriven,
    #[error("it was driven again {MOST_REDRIVES} times already")]
    TooOften,
    /// Replaying the turn could propose a call that ran again under a new action id.
    #[error("an action of it was created after its conversation was last stored")]
    ActedSince,
}

/// How a call from outside came (the MCP gateway, or the gate API) and the key a repeated
/// identical call finds it by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateOrigin {
    pub via: GateVia,
    pub call_key: String,
    /// The caller's own id for the call, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The caller's conversation or thread the call belongs to, shown beside it to reviewers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// The hash of the tool and arguments asked for: a call id reused for another call is told
    /// apart by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateVia {
    Mcp,
    Api,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub id: RunId,
    pub tenant: TenantId,
    /// The agent definition this run follows: its policy, tools and model.
    pub agent: AgentName,
    /// The person the agent works for (the claimant); never an approver of this run.
    pub requested_by: PersonId,
    /// The person who started the run, when that is someone else; never an approver either.
    #[serde(default)]
    pub started_by: Option<PersonId>,
    /// What authentication said of the requester when the run started (roles, token claims):
    /// what policy rules read of them for every call of the run.
    #[serde(default, skip_serializing_if = "Standing::is_empty")]
    pub standing: Standing,
    pub task: String,
    pub status: RunStatus,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub paused: Option<PausedTurn>,
    #[serde(default)]
    pub answer: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    pub policy_version: u32,
    /// Overrides the policy's time to decide for this run's approvals.
    #[serde(default, with = "optional_secs")]
    pub approval_ttl: Option<Duration>,
    /// Set on a run that holds one call an agent outside Countersign proposed: no model drives
    /// it, and it ends with that call's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateOrigin>,
    /// How many drivers took the run's lease from a drive message: a message for a lease
    /// already taken is ignored, so two drivers never drive one run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drives: u32,
    /// How many times the sweep re-drove the run after its driver stopped mid-turn.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub redriven: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// How many of `messages` the store's append-only audit items hold, the first (the task,
    /// which the run's `task` is) included; the store's run item carries the rest while it
    /// stays small. Bookkeeping, never serialized.
    #[serde(skip)]
    pub stored_messages: usize,
    /// What `stored_messages` becomes once the write being committed lands. Bookkeeping.
    #[serde(skip)]
    pub logging_messages: Option<usize>,
    /// How many of `messages` the store holds, its audit items and its run item together: a
    /// driver writes the run before a model turn only when some are not. Bookkeeping.
    #[serde(skip)]
    pub written_messages: usize,
    /// Model turns answered with no usage to audit since the run was last written: counted
    /// with its next write rather than in a transaction of their own. Bookkeeping.
    #[serde(skip)]
    pub uncounted_turns: u64,
}

/// Whom a call is decided for: the run's tenant and requester, and what authentication said of
/// them when the run began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker<'a> {
    pub tenant: &'a TenantId,
    pub person: &'a PersonId,
    pub standing: &'a Standing,
}

impl Run {
    /// Whom its calls are decided for.
    pub fn asker(&self) -> Asker<'_> {
        Asker {
            tenant: &self.tenant,
            person: &self.requested_by,
            standing: &self.standing,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn start(
        id: RunId,
        tenant: TenantId,
        agent: AgentName,
        requested_by: PersonId,
        started_by: Option<PersonId>,
        task: &str,
        policy_version: u32,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            id,
            tenant,
            agent,
            started_by: started_by.filter(|s| *s != requested_by),
            requested_by,
            standing: Standing::default(),
            task: task.to_string(),
            status: RunStatus::Running,
            messages: vec![Message::user_text(task)],
            paused: None,
            answer: None,
            error: None,
            policy_version,
            approval_ttl: None,
            gate: None,
            drives: 0,
            redriven: 0,
            created_at: now,
            updated_at: now,
            stored_messages: 1,
            logging_messages: None,
            written_messages: 0,
            uncounted_turns: 0,
        }
    }

    /// Everyone who may not decide this run's approvals.
    pub fn requesters(&self) -> Vec<PersonId> {
        std::iter::once(self.requested_by.clone())
            .chain(self.started_by.clone())
            .collect()
    }

    fn expect(&self, expected: RunStatus) -> Result<(), RunError> {
        if self.status != expected {
            return Err(RunError::WrongStatus {
                run: self.id.clone(),
                status: self.status,
                expected,
            });
        }
        Ok(())
    }

    /// `from → to` at `now`, refused unless the run is at `from`.
    fn step(&mut self, from: RunStatus, to: RunStatus, now: DateTime<Utc>) -> Result<(), RunError> {
        self.expect(from)?;
        self.status = to;
        self.updated_at = now;
        Ok(())
    }

    pub fn pause(&mut self, turn: PausedTurn, now: DateTime<Utc>) -> Result<(), RunError> {
        self.step(RunStatus::Running, RunStatus::AwaitingApproval, now)?;
        self.paused = Some(turn);
        Ok(())
    }

    /// Records the result of one held call that has none yet.
    pub fn settle(
        &mut self,
        action: &ActionId,
        result: ToolResultText,
        now: DateTime<Utc>,
    ) -> Result<(), RunError> {
        if !self.is_waiting_on(action) {
            return Err(RunError::NotHeld {
                run: self.id.clone(),
                action: action.clone(),
            });
        }
        let turn = self.paused.as_mut().expect("waiting implies a paused turn");
        let call = turn
            .calls
            .iter_mut()
            .find(|c| c.action_id == *action)
            .expect("waiting implies the call");
        call.result = Some(result);
        self.updated_at = now;
        Ok(())
    }

    /// The run is paused and the call of this action still has no result.
    pub fn is_waiting_on(&self, action: &ActionId) -> bool {
        self.status == RunStatus::AwaitingApproval
            && self.paused.as_ref().is_some_and(|t| {
                t.calls
                    .iter()
                    .any(|c| c.action_id == *action && c.result.is_none())
            })
    }

    /// Every call of the paused turn has its result.
    pub fn turn_is_complete(&self) -> bool {
        self.paused
            .as_ref()
            .is_some_and(|t| t.calls.iter().all(|c| c.result.is_some()))
    }

    /// `awaiting_approval → running`: the held results go back to the model in one message.
    pub fn resume(&mut self, now: DateTime<Utc>) -> Result<(), RunError> {
        self.expect(RunStatus::AwaitingApproval)?;
        if !self.turn_is_complete() {
            return Err(RunError::WrongStatus {
                run: self.id.clone(),
                status: self.status,
                expected: RunStatus::Running,
            });
        }
        let turn = self.paused.take().expect("a complete turn exists");
        let results = turn
            .calls
            .into_iter()
            .map(|c| c.result.expect("checked above").into_block(&c.tool_use_id))
            .collect();
        self.messages.push(Message {
            role: Speaker::User,
            content: results,
        });
        self.status = RunStatus::Running;
        self.updated_at = now;
        Ok(())
    }

    pub fn push_results(&mut self, results: Vec<Block>) {
        self.messages.push(Message {
            role: Speaker::User,
            content: results,
        });
    }

    pub fn finish(&mut self, answer: String, now: DateTime<Utc>) -> Result<(), RunError> {
        self.step(RunStatus::Running, RunStatus::Done, now)?;
        self.answer = Some(answer);
        Ok(())
    }

    /// `running` or `awaiting_approval → failed`. A finished run never changes again: the store
    /// writes its item for the last time, with the events that finished it.
    pub fn fail(&mut self, error: String, now: DateTime<Utc>) -> Result<(), RunError> {
        if self.status.is_finished() {
            return Err(RunError::WrongStatus {
                run: self.id.clone(),
                status: self.status,
                expected: RunStatus::Running,
            });
        }
        self.status = RunStatus::Failed;
        self.error = Some(error);
        self.paused = None;
        self.updated_at = now;
        Ok(())
    }

    /// A driver still holds the running run: its lease runs from `now`.
    pub fn renew_lease(&mut self, now: DateTime<Utc>) -> Result<(), RunError> {
        self.step(RunStatus::Running, RunStatus::Running, now)
    }

    /// A drive message's driver takes the run's lease: the `drive`-th, only while no other
    /// driver took it since that message was sent.
    pub fn take_drive(&mut self, drive: u32, now: DateTime<Utc>) -> Result<(), NotDriven> {
        if self.status != RunStatus::Running {
            return Err(NotDriven::Moved(self.status));
        }
        if self.drives != drive {
            return Err(NotDriven::Taken);
        }
        self.drives += 1;
        self.updated_at = now;
        Ok(())
    }

    /// The sweep hands a running run whose driver stopped to a new driver, which replays its
    /// stored conversation. Safe only when the model's last reply left nothing behind: every
    /// action of the run (`acted`, by tool use id) is answered in the stored messages, and
    /// the conversation ends on the user's side. At most [`MOST_REDRIVES`] times.
    pub fn redrive<'a>(
        &mut self,
        acted: impl IntoIterator<Item = &'a str>,
        now: DateTime<Utc>,
    ) -> Result<(), NotRedriven> {
        if self.status != RunStatus::Running || self.gate.is_some() {
            return Err(NotRedriven::NotDriven);
        }
        if self.redriven >= MOST_REDRIVES {
            return Err(NotRedriven::TooOften);
        }
        let answered: Vec<&str> = self
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                Block::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
                _ => None,
            })
            .collect();
        let ends_with_user = self
            .messages
            .last()
            .is_some_and(|m| m.role == Speaker::User);
        if !ends_with_user || acted.into_iter().any(|id| !answered.contains(&id)) {
            return Err(NotRedriven::ActedSince);
        }
        self.redriven += 1;
        self.updated_at = now;
        Ok(())
    }

    pub fn cancel(&mut self, now: DateTime<Utc>) -> Result<(), RunError> {
        if self.status.is_finished() {
            return Err(RunError::WrongStatus {
                run: self.id.clone(),
                status: self.status,
                expected: RunStatus::AwaitingApproval,
            });
        }
        self.status = RunStatus::Cancelled;
        self.updated_at = now;
        Ok(())
    }
}

mod optional_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Run {
        Run::start(
            RunId::parse("run-1").unwrap(),
            TenantId::parse("acme").unwrap(),
            AgentName::parse("expense").unwrap(),
            PersonId::parse("ben").unwrap(),
            Some(PersonId::parse("ops").unwrap()),
            "Process expense claim c-102",
            1,
            Utc::now(),
        )
    }

    fn held(tool_use: &str, action: &str, result: Option<&str>) -> HeldCall {
        HeldCall {
            tool_use_id: tool_use.into(),
            action_id: ActionId::parse(action).unwrap(),
            result: result.map(ToolResultText::ok),
        }
    }

    #[test]
    fn the_requester_and_the_starter_may_not_decide() {
        let names: Vec<String> = run().requesters().iter().map(|p| p.to_string()).collect();
        assert_eq!(names, ["ben", "ops"]);
    }

    #[test]
    fn a_paused_turn_resumes_only_with_every_result_in_one_message() {
        let mut r = run();
        let turn = PausedTurn {
            calls: vec![
                held("t1", "act-read", Some("claim")),
                held("t2", "act-pay", None),
            ],
        };
        r.pause(turn, Utc::now()).unwrap();
        assert!(!r.turn_is_complete());
        assert!(
            r.resume(Utc::now()).is_err(),
            "cannot resume with a call undecided"
        );
        let pay = ActionId::parse("act-pay").unwrap();
        assert!(r.is_waiting_on(&pay));
        r.settle(&pay, ToolResultText::ok("paid"), Utc::now())
            .unwrap();
        assert!(!r.is_waiting_on(&pay), "a call is settled once");
        r.resume(Utc::now()).unwrap();
        assert_eq!(r.status, RunStatus::Running);
        let last = r.messages.last().unwrap();
        assert_eq!(last.role, Speaker::User);
        let ids: Vec<&str> = last
            .content
            .iter()
            .map(|b| match b {
                Block::ToolResult { tool_use_id, .. } => tool_use_id.as_str(),
                _ => "",
            })
            .collect();
        assert_eq!(ids, ["t1", "t2"], "results keep the order of the calls");
    }

    #[test]
    fn a_settled_call_cannot_be_settled_again() {
        let mut r = run();
        r.pause(
            PausedTurn {
                calls: vec![held("t1", "act-pay", None)],
            },
            Utc::now(),
        )
        .unwrap();
        let pay = ActionId::parse("act-pay").unwrap();
        r.settle(&pay, ToolResultText::ok("x"), Utc::now()).unwrap();
        let again = r.settle(&pay, ToolResultText::ok("y"), Utc::now());
        assert!(matches!(again, Err(RunError::NotHeld { .. })));
        assert!(r.turn_is_complete());
    }

    /// A run whose model proposed `tool_use` in its first turn, answered or not.
    fn after_a_call(answered: bool) -> Run {
        let mut run = run();
        run.messages.push(Message {
            role: Speaker::Assistant,
            content: vec![Block::ToolUse {
                id: "toolu_1".into(),
                name: "get_claim".into(),
                input: serde_json::json!({"claim_id": "c-102"}),
            }],
        });
        if answered {
            run.push_results(vec![
                ToolResultText::ok("c-102: $250").into_block("toolu_1"),
            ]);
        }
        run
    }

    #[test]
    fn a_run_is_driven_again_only_while_every_action_is_answered_in_its_conversation() {
        let now = Utc::now();
        let mut fresh = run();
        assert_eq!(fresh.redrive([], now), Ok(()));
        assert_eq!((fresh.redriven, fresh.updated_at), (1, now));
        let mut answered = after_a_call(true);
        assert_eq!(answered.redrive(["toolu_1"], now), Ok(()));
        // The reply was stored, its call made, its result not: replaying could run it again.
        let mut unanswered = after_a_call(false);
        assert_eq!(
            unanswered.redrive(["toolu_1"], now),
            Err(NotRedriven::ActedSince)
        );
        // An action of a reply that was never stored.
        let mut unstored = after_a_call(true);
        assert_eq!(
            unstored.redrive(["toolu_1", "toolu_2"], now),
            Err(NotRedriven::ActedSince)
        );
        assert_eq!(unstored.redriven, 0);
    }

    #[test]
    fn a_run_is_driven_again_at_most_three_times_and_never_once_it_left_running() {
        let now = Utc::now();
        let mut run = run();
        for _ in 0..MOST_REDRIVES {
            run.redrive([], now).unwrap();
        }
        assert_eq!(run.redrive([], now), Err(NotRedriven::TooOften));
        let mut paused = self::run();
        paused.pause(PausedTurn { calls: vec![] }, now).unwrap();
        assert_eq!(paused.redrive([], now), Err(NotRedriven::NotDriven));
    }

    #[test]
    fn a_drive_message_takes_the_lease_it_names_once() {
        let now = Utc::now();
        let mut run = run();
        assert_eq!(run.take_drive(1, now), Err(NotDriven::Taken));
        assert_eq!(run.take_drive(0, now), Ok(()));
        assert_eq!(run.drives, 1);
        assert_eq!(run.take_drive(0, now), Err(NotDriven::Taken));
        run.finish("done".into(), now).unwrap();
        assert_eq!(
            run.take_drive(1, now),
            Err(NotDriven::Moved(RunStatus::Done))
        );
    }

    #[test]
    fn a_finished_run_cannot_be_cancelled() {
        let mut r = run();
        r.finish("done".into(), Utc::now()).unwrap();
        assert!(r.cancel(Utc::now()).is_err());
        assert_eq!(r.status, RunStatus::Done);
    }

    #[test]
    fn a_finished_run_cannot_fail_afterwards() {
        let mut r = run();
        r.finish("done".into(), Utc::now()).unwrap();
        assert!(r.fail("late".into(), Utc::now()).is_err());
        assert_eq!((r.status, r.error), (RunStatus::Done, None));
        let mut r = run();
        r.cancel(Utc::now()).unwrap();
        assert!(r.fail("late".into(), Utc::now()).is_err());
        assert_eq!(r.status, RunStatus::Cancelled);
    }

    #[test]
    fn a_run_status_reads_as_its_record_stores_it() {
        assert_eq!(RunStatus::Cancelled.as_str(), "cancelled");
    }
}
