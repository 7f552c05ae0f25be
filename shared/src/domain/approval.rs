//! A request for people to decide one action version, and the rules every decision passes.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::action::{Action, ActionStatus, ProposedCall};
use super::args::{Args, ArgsHash};
use super::identity::{Actor, Identity, Standing};
use super::ids::{
    ActionId, ActionVersion, AgentName, ApprovalId, DecisionId, PersonId, Role, RunId, TenantId,
};
use super::log_slot::LogSlot;
use super::money::Amount;
use super::names::{serde_name, shown_by_serde_name};
use super::policy::history::HistorySlot;
use super::policy::{EditRefusal, Escalation, LogOnly, Need, Policy, Requirement, ToolHints};
use super::run::Asker;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    AwaitingApproval,
    Approved,
    Rejected,
    Expired,
    Superseded,
    Cancelled,
    /// A recovery owner said whether the call took effect.
    Answered,
}

/// What an approval asks of people.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    /// May this exact call run? Approve, edit or reject.
    #[default]
    Action,
    /// Did this call take effect? Its outcome is unknown and its tool cannot say: the agent's
    /// recovery owner answers `took_effect` or `did_not_take_effect`. It never expires.
    Recovery,
}

shown_by_serde_name!(ApprovalStatus);

/// What a reviewer chose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "choice", rename_all = "snake_case")]
pub enum Choice {
    Approve,
    /// Approve a lower amount: the action gets a new version, which policy evaluates again.
    Edit {
        amount: Amount,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    Reject {
        reason: String,
    },
    /// A recovery owner's answer: the call took effect.
    TookEffect {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// A recovery owner's answer: the call did not take effect.
    DidNotTakeEffect {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}

impl Choice {
    pub fn name(&self) -> &'static str {
        serde_name(self)
    }

    /// The text a reviewer wrote with the choice, if any.
    pub fn text(&self) -> Option<&str> {
        match self {
            Choice::Approve => None,
            Choice::Reject { reason } => Some(reason),
            Choice::Edit { note, .. }
            | Choice::TookEffect { note }
            | Choice::DidNotTakeEffect { note } => note.as_deref(),
        }
    }

    fn answers(&self) -> bool {
        matches!(
            self,
            Choice::TookEffect { .. } | Choice::DidNotTakeEffect { .. }
        )
    }
}

/// A decision as submitted: by an authenticated person, about the version they saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRequest {
    pub decision_id: DecisionId,
    pub action_version: ActionVersion,
    pub choice: Choice,
}

/// What a recorded decision did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum DecisionEffect {
    /// Counted toward the quorum; more distinct approvers are still needed.
    Counted {
        still_needed: u8,
    },
    Approved,
    Rejected,
    /// This version was superseded by the edited one.
    Edited {
        new_version: ActionVersion,
    },
    /// A recovery owner said whether the call took effect.
    Answered {
        took_effect: bool,
    },
}

/// One decision, as recorded on the approval it decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub decision_id: DecisionId,
    pub by: PersonId,
    #[serde(flatten)]
    pub choice: Choice,
    pub action_version: ActionVersion,
    pub args_hash: ArgsHash,
    pub at: DateTime<Utc>,
    pub effect: DecisionEffect,
    /// The roles the approval needs that its decider held when they decided: which of its
    /// requirements an approval counts toward. Empty on decisions made before approvals could
    /// need several roles: those count toward the approval's own role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<Role>,
    /// Where its `decision` event sits in the run's log: the approval's item holds that event,
    /// written once by this decision and carried unchanged by every later write of the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged: Option<LogSlot>,
}

/// Why a decision is refused. Nothing is written for any of these except `Expired`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("nobody approves their own request: {person} asked for this")]
    OwnRequest { person: PersonId },
    #[error("{person} does not hold the {role} role this approval needs")]
    MissingRole { person: PersonId, role: Role },
    #[error("this approval is already {status}")]
    AlreadyResolved { status: ApprovalStatus },
    #[error("this approval was superseded by an edit; decide the new version instead{}", current.as_ref().map(|c| format!(" (approval {c})")).unwrap_or_default())]
    Superseded { current: Option<ApprovalId> },
    #[error("the decision was about version {sent}, but this approval is for version {current}")]
    StaleVersion {
        sent: ActionVersion,
        current: ActionVersion,
    },
    #[error("the deadline passed at {expires_at}; the approval has expired")]
    Expired { expires_at: DateTime<Utc> },
    #[error("{person} has already approved this; another person must approve it")]
    AlreadyApprovedBy { person: PersonId },
    #[error("decision id {decision_id} was already used for a different decision")]
    DecisionIdReused { decision_id: DecisionId },
    #[error("{0}")]
    Edit(#[from] EditRefusal),
    #[error("a rejection needs a reason")]
    EmptyReason,
    #[error("{}", match kind {
        ApprovalKind::Recovery => "this asks whether a call took effect: answer took_effect or did_not_take_effect",
        ApprovalKind::Action => "took_effect and did_not_take_effect answer a recovery; approve, edit or reject this approval",
    })]
    WrongChoice { kind: ApprovalKind },
}

/// The previous version, kept so a reviewer sees what an edit changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousVersion {
    pub version: ActionVersion,
    pub args: Args,
    pub edited_by: PersonId,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: ApprovalId,
    pub tenant: TenantId,
    /// The agent whose policy rules on this approval's edits.
    pub agent: AgentName,
    #[serde(default)]
    pub kind: ApprovalKind,
    pub run_id: RunId,
    pub action_id: ActionId,
    pub action_version: ActionVersion,
    /// A copy of the immutable action version, so a reviewer reads exactly what runs.
    pub tool_use_id: String,
    pub tool: String,
    /// What the tool said of itself when it was proposed, as policy matched it.
    #[serde(default, skip_serializing_if = "is_plain")]
    pub hints: ToolHints,
    pub args: Args,
    pub args_hash: ArgsHash,
    pub explanation: String,
    pub previous: Option<PreviousVersion>,
    pub reason: String,
    pub approver_role: Role,
    pub quorum: u8,
    /// The other roles that must approve too, each with its quorum: where approval rules of
    /// several roles matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Need>,
    /// The policy rules that asked for a person: why, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// What the policy's log-only rules would have made of the call, where it has some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_only: Option<LogOnly>,
    /// People who may never decide this: whoever asked for the run and whoever started it.
    pub requested_by: Vec<PersonId>,
    pub policy_version: u32,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub status: ApprovalStatus,
    #[serde(default)]
    pub decisions: Vec<Decision>,
    pub superseded_by: Option<ApprovalId>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub reminded_at: Option<DateTime<Utc>>,
    /// What people of the organisation said about it without deciding it, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comments: Vec<Comment>,
    /// Policy's escalation steps, as they stood when the approval opened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate: Vec<Escalation>,
    /// The roles it was escalated to so far, in order: their people may decide it too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalated_to: Vec<Role>,
    /// Where its call is counted in the policy's history windows: the engine's, kept on its
    /// item ([`HistorySlot`]), never shown.
    #[serde(default, skip_serializing)]
    pub counted: Vec<HistorySlot>,
    /// What authentication said of the run's requester, kept so that an edit's new version is
    /// decided for them without reading the run; `None` on approvals opened before it was kept.
    /// The engine's, never shown: reviewers see the requester, not their claims.
    #[serde(default, skip_serializing)]
    pub standing: Option<Standing>,
}

/// A remark on an approval that decides nothing, such as a question to the requester.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comment {
    pub by: PersonId,
    pub text: String,
    pub at: DateTime<Utc>,
}

/// Who asks, under which rules, and until when: what an approval adds to the call it is for.
#[derive(Debug, Clone)]
pub struct Asking {
    pub agent: AgentName,
    pub hints: ToolHints,
    /// People who may never decide it: the run's requester and the call's claimants.
    pub requested_by: Vec<PersonId>,
    /// The run's requester's standing, which decided the call, where it is known.
    pub standing: Option<Standing>,
    pub policy_version: u32,
    pub opened_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl Approval {
    /// Whom its call is decided for, where the approval keeps their standing.
    pub fn asker(&self) -> Option<Asker<'_>> {
        Some(Asker {
            tenant: &self.tenant,
            person: self.requested_by.first()?,
            standing: self.standing.as_ref()?,
        })
    }

    /// A new approval of one proposed call version, waiting for people on policy's terms.
    pub fn open(call: ProposedCall, requirement: &Requirement, asking: Asking) -> Self {
        let args_hash = call.hash();
        Self {
            id: ApprovalId::generate(),
            tenant: call.tenant,
            agent: asking.agent,
            kind: ApprovalKind::Action,
            run_id: call.run_id,
            action_id: call.id,
            action_version: call.version,
            tool_use_id: call.tool_use_id,
            tool: call.tool,
            hints: asking.hints,
            args_hash,
            args: call.args,
            explanation: call.explanation,
            previous: None,
            reason: requirement.reason.clone(),
            approver_role: requirement.approver_role.clone(),
            quorum: requirement.quorum,
            also: requirement.also.clone(),
            rules: call.rules.clone(),
            log_only: call.log_only.clone(),
            requested_by: asking.requested_by,
            policy_version: asking.policy_version,
            created_at: asking.opened_at,
            expires_at: asking.expires_at,
            status: ApprovalStatus::AwaitingApproval,
            decisions: Vec::new(),
            superseded_by: None,
            resolved_at: None,
            reminded_at: None,
            comments: Vec::new(),
            escalate: requirement.escalate.clone(),
            escalated_to: Vec::new(),
            counted: Vec::new(),
            standing: asking.standing,
        }
    }

    /// Asks the agent's recovery owner whether a call whose outcome is unknown took effect.
    /// Its tool cannot reconcile it, so a person must; it waits until one answers.
    pub fn recovery(action: &Action, owner: Role, detail: &str, asking: Asking) -> Self {
        // The tool's words, kept to a sentence's length in the question stored with it.
        let detail = super::budget::cut(detail, super::policy::MAX_REASON, "detail")
            .unwrap_or_else(|| detail.to_string());
        let call = ProposedCall {
            agent: asking.agent.clone(),
            id: action.id.clone(),
            version: action.version,
            tenant: action.tenant.clone(),
            run_id: action.run_id.clone(),
            tool_use_id: action.tool_use_id.clone(),
            tool: action.tool.clone(),
            args: action.args.clone(),
            explanation: action.explanation.clone(),
            rules: Vec::new(),
            log_only: None,
        };
        let requirement = Requirement {
            reason: format!(
                "Nobody can tell whether {} {} took effect ({detail}). Did it?",
                action.tool,
                action.key()
            ),
            approver_role: owner,
            quorum: 1,
            ttl: std::time::Duration::ZERO,
            escalate: Vec::new(),
            also: Vec::new(),
        };
        let mut recovery = Self::open(call, &requirement, asking);
        recovery.kind = ApprovalKind::Recovery;
        // The version as it was approved, under the hash scheme it was approved with.
        recovery.args_hash = action.args_hash.clone();
        recovery
    }

    /// The distinct people whose approval of this version counts toward the quorum of any of
    /// its roles.
    pub fn approvers(&self) -> Vec<&PersonId> {
        let mut people: Vec<&PersonId> = self.approvals().map(|d| &d.by).collect();
        people.sort();
        people.dedup();
        people
    }

    /// The approvals (and edits, which count as their editor's approval) of this version.
    fn approvals(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.iter().filter(|d| {
            matches!(d.choice, Choice::Approve | Choice::Edit { .. })
                && d.action_version == self.action_version
        })
    }

    /// Each requirement: its roles (the approval's own role and those it was escalated to;
    /// then each other role), its quorum, and how many more distinct people of it must approve.
    pub fn needs(&self) -> Vec<(Vec<&Role>, u8, u8)> {
        let own: Vec<&Role> = self.deciding_roles().collect();
        let mut needs = vec![(own, self.quorum)];
        needs.extend(self.also.iter().map(|need| (vec![&need.role], need.quorum)));
        needs
            .into_iter()
            .enumerate()
            .map(|(index, (roles, quorum))| {
                let mut people: Vec<&PersonId> = self
                    .approvals()
                    .filter(|d| match d.roles.is_empty() {
                        // Decided before approvals needed several roles: the approval's own.
                        true => index == 0,
                        false => d.roles.iter().any(|r| roles.contains(&r)),
                    })
                    .map(|d| &d.by)
                    .collect();
                people.sort();
                people.dedup();
                let more = quorum.saturating_sub(people.len() as u8);
                (roles, quorum, more)
            })
            .collect()
    }

    /// How many more approvals it needs, every role's together.
    pub fn still_needed(&self) -> u8 {
        self.needs().iter().map(|(_, _, more)| more).sum()
    }

    /// Seconds from its opening to `at`, never fewer than none: how long a decision at `at`
    /// took.
    pub fn seconds_open(&self, at: DateTime<Utc>) -> f64 {
        (at - self.created_at).num_milliseconds().max(0) as f64 / 1000.0
    }

    /// Past the deadline. A recovery is never overdue: only a person can settle it.
    pub fn is_overdue(&self, now: DateTime<Utc>) -> bool {
        self.kind == ApprovalKind::Action && now >= self.expires_at
    }

    /// A recovery the call's own caller answered by reporting its outcome after its claim's
    /// lease ended: resolved `answered`, with no person's decision. False, and unchanged, for
    /// anything but an open recovery.
    pub fn answered_by_caller(&mut self, now: DateTime<Utc>) -> bool {
        let open =
            self.kind == ApprovalKind::Recovery && self.status == ApprovalStatus::AwaitingApproval;
        if open {
            self.resolve(ApprovalStatus::Answered, now);
        }
        open
    }

    fn resolve(&mut self, status: ApprovalStatus, now: DateTime<Utc>) {
        self.status = status;
        self.resolved_at = Some(now);
    }

    /// Applies one decision, or refuses it. On `Ok` the approval holds the recorded decision;
    /// `Err(Refusal::Expired)` also leaves the approval expired, and that change must be stored.
    pub fn decide(
        &mut self,
        who: &Identity,
        request: &DecisionRequest,
        policy: &Policy,
        now: DateTime<Utc>,
    ) -> Result<Decided, Refusal> {
        if let Some(recorded) = self
            .decisions
            .iter()
            .find(|d| d.decision_id == request.decision_id)
        {
            let same = recorded.by == who.person
                && recorded.choice == request.choice
                && recorded.action_version == request.action_version;
            return match same {
                true => Ok(Decided::AlreadyRecorded(recorded.clone())),
                false => Err(Refusal::DecisionIdReused {
                    decision_id: request.decision_id.clone(),
                }),
            };
        }
        match self.status {
            ApprovalStatus::AwaitingApproval => {}
            ApprovalStatus::Superseded => {
                return Err(Refusal::Superseded {
                    current: self.superseded_by.clone(),
                });
            }
            status => return Err(Refusal::AlreadyResolved { status }),
        }
        if self.is_overdue(now) {
            self.resolve(ApprovalStatus::Expired, now);
            return Err(Refusal::Expired {
                expires_at: self.expires_at,
            });
        }
        if request.choice.answers() != (self.kind == ApprovalKind::Recovery) {
            return Err(Refusal::WrongChoice { kind: self.kind });
        }
        if request.action_version != self.action_version {
            return Err(Refusal::StaleVersion {
                sent: request.action_version,
                current: self.action_version,
            });
        }
        if self.requested_by.contains(&who.person) {
            return Err(Refusal::OwnRequest {
                person: who.person.clone(),
            });
        }
        // The roles of the approval's requirements that this person holds: an approval counts
        // toward those, and a person holding none may not decide.
        let needs = self.needs();
        let held: Vec<Role> = needs
            .iter()
            .flat_map(|(roles, _, _)| roles.iter())
            .filter(|role| who.has_role(role))
            .map(|role| (*role).clone())
            .collect();
        if held.is_empty() {
            return Err(Refusal::MissingRole {
                person: who.person.clone(),
                role: self.approver_role.clone(),
            });
        }

        let mut edited_args = None;
        let effect = match &request.choice {
            Choice::Approve => {
                if self.approvers().contains(&&who.person) {
                    return Err(Refusal::AlreadyApprovedBy {
                        person: who.person.clone(),
                    });
                }
                // What remains once this person's approval counts for every role they hold.
                let left: u8 = needs
                    .iter()
                    .map(
                        |(roles, _, more)| match roles.iter().any(|r| held.contains(r)) {
                            true => more.saturating_sub(1),
                            false => *more,
                        },
                    )
                    .sum();
                let counts = needs
                    .iter()
                    .any(|(roles, _, more)| *more > 0 && roles.iter().any(|r| held.contains(r)));
                match (counts, left) {
                    (false, _) => {
                        let role = needs
                            .iter()
                            .find(|(_, _, more)| *more > 0)
                            .and_then(|(roles, _, _)| roles.first())
                            .map_or_else(|| self.approver_role.clone(), |r| (*r).clone());
                        return Err(Refusal::MissingRole {
                            person: who.person.clone(),
                            role,
                        });
                    }
                    (true, 0) => DecisionEffect::Approved,
                    (true, n) => DecisionEffect::Counted { still_needed: n },
                }
            }
            Choice::Reject { reason } if reason.trim().is_empty() => {
                return Err(Refusal::EmptyReason);
            }
            Choice::Reject { .. } => DecisionEffect::Rejected,
            Choice::Edit { amount, .. } => {
                edited_args = Some(policy.edit_amount(&self.tool, &self.args, *amount)?);
                DecisionEffect::Edited {
                    new_version: self.action_version.next(),
                }
            }
            Choice::TookEffect { .. } => DecisionEffect::Answered { took_effect: true },
            Choice::DidNotTakeEffect { .. } => DecisionEffect::Answered { took_effect: false },
        };
        let decision = Decision {
            decision_id: request.decision_id.clone(),
            by: who.person.clone(),
            choice: request.choice.clone(),
            action_version: self.action_version,
            args_hash: self.args_hash.clone(),
            at: now,
            effect: effect.clone(),
            roles: held,
            logged: None,
        };
        self.decisions.push(decision.clone());
        match effect {
            DecisionEffect::Approved => self.resolve(ApprovalStatus::Approved, now),
            DecisionEffect::Rejected => self.resolve(ApprovalStatus::Rejected, now),
            DecisionEffect::Edited { .. } => self.resolve(ApprovalStatus::Superseded, now),
            DecisionEffect::Answered { .. } => self.resolve(ApprovalStatus::Answered, now),
            DecisionEffect::Counted { .. } => {}
        }
        Ok(Decided::New {
            decision,
            edited_args,
        })
    }

    /// The sweep's transition: nobody decided in time.
    pub fn expire(&mut self, now: DateTime<Utc>) -> bool {
        let due = self.status == ApprovalStatus::AwaitingApproval && self.is_overdue(now);
        if due {
            self.resolve(ApprovalStatus::Expired, now);
        }
        due
    }

    /// When to remind people of this approval, `lead` before its deadline. `None` when its
    /// whole time to decide fits in the lead: the request itself was that reminder.
    /// The roles whose people may decide it: the approver role, and those it was escalated to.
    pub fn deciding_roles(&self) -> impl Iterator<Item = &Role> {
        std::iter::once(&self.approver_role).chain(self.escalated_to.iter())
    }

    /// The next escalation step and when it is due, while the approval waits.
    pub fn next_escalation(&self) -> Option<(DateTime<Utc>, &Escalation)> {
        if self.status != ApprovalStatus::AwaitingApproval || self.kind != ApprovalKind::Action {
            return None;
        }
        let step = self.escalate.get(self.escalated_to.len())?;
        let at = self
            .created_at
            .checked_add_signed(Duration::from_std(step.after).ok()?)?;
        (at < self.expires_at).then_some((at, step))
    }

    /// The sweep's escalation: widens who may decide to the next step's role if it is due and
    /// the approval still waits, not overdue. Expiry stays the final word.
    pub fn escalate(&mut self, now: DateTime<Utc>) -> Option<Role> {
        let (at, step) = self.next_escalation()?;
        if at > now || self.is_overdue(now) {
            return None;
        }
        let role = step.to.clone();
        self.escalated_to.push(role.clone());
        Some(role)
    }

    pub fn reminder_at(&self, lead: Duration) -> Option<DateTime<Utc>> {
        if self.kind == ApprovalKind::Recovery {
            return None;
        }
        self.expires_at
            .checked_sub_signed(lead)
            .filter(|at| *at > self.created_at)
    }

    /// The sweep's reminder: marks the approval reminded if it still waits, is not overdue, its
    /// reminder is due and none was sent yet.
    pub fn remind(&mut self, now: DateTime<Utc>, lead: Duration) -> bool {
        let due = self.status == ApprovalStatus::AwaitingApproval
            && self.reminded_at.is_none()
            && !self.is_overdue(now)
            && self.reminder_at(lead).is_some_and(|at| at <= now);
        if due {
            self.reminded_at = Some(now);
        }
        due
    }

    pub fn cancel(&mut self, now: DateTime<Utc>) -> bool {
        let open = self.status == ApprovalStatus::AwaitingApproval;
        if open {
            self.resolve(ApprovalStatus::Cancelled, now);
        }
        open
    }

    /// The action version while this approval waits, built from the approval's own copy. The
    /// engine stores exactly this when it opens the approval, so the two never disagree.
    pub fn awaiting_action(&self) -> Action {
        Action {
            id: self.action_id.clone(),
            version: self.action_version,
            tenant: self.tenant.clone(),
            run_id: self.run_id.clone(),
            tool_use_id: self.tool_use_id.clone(),
            tool: self.tool.clone(),
            args: self.args.clone(),
            args_hash: self.args_hash.clone(),
            explanation: self.explanation.clone(),
            rules: self.rules.clone(),
            log_only: self.log_only.clone(),
            status: ActionStatus::AwaitingApproval,
            authorized_by: Vec::new(),
            approval_id: Some(self.id.clone()),
            result: None,
            proposed_at: self.created_at,
            updated_at: self.created_at,
            claimed: None,
        }
    }

    /// The people who approved this exact version, as the action records who authorized it.
    pub fn authorized_by(&self) -> Vec<Actor> {
        self.approvers().into_iter().map(Actor::person).collect()
    }
}

/// Hints that say nothing, which an approval's JSON leaves out (and its stored form too).
pub(crate) fn is_plain(hints: &ToolHints) -> bool {
    *hints == ToolHints::default()
}

/// The result of a decision the approval accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The same decision id was seen before: here is what it did then. Nothing changes.
    AlreadyRecorded(Decision),
    /// A new decision; an edit brings the next version's arguments.
    New {
        decision: Decision,
        edited_args: Option<Args>,
    },
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use chrono::Duration;

    /// Reimbursements above $75 wait for one finance approver, who may only lower the amount.
    const POLICY: &str = include_str!("../../tests/fixtures/policies/capped-reimburse.toml");

    fn policy() -> Policy {
        Policy::from_toml(POLICY).unwrap()
    }

    fn person(name: &str, roles: &[&str]) -> Identity {
        Identity::new(
            TenantId::parse("acme").unwrap(),
            PersonId::parse(name).unwrap(),
            roles
                .iter()
                .map(|r| Role::parse(r).unwrap())
                .collect::<BTreeSet<_>>(),
        )
    }

    fn approval(quorum: u8, now: DateTime<Utc>) -> Approval {
        let call = crate::domain::action::tests::proposed_call("capped");
        let requirement = Requirement {
            reason: "r".into(),
            approver_role: Role::parse("finance").unwrap(),
            quorum,
            ttl: std::time::Duration::from_secs(24 * 3600),
            escalate: Vec::new(),
            also: Vec::new(),
        };
        let asking = Asking {
            agent: AgentName::parse("expense").unwrap(),
            hints: ToolHints::default(),
            requested_by: vec![PersonId::parse("ben").unwrap()],
            standing: None,
            policy_version: 1,
            opened_at: now,
            expires_at: now + Duration::hours(24),
        };
        Approval::open(call, &requirement, asking)
    }

    /// `who` decides `choice` as decision `id`, under the test policy. Everyone is in finance
    /// but chen; ben asked for the approval.
    fn decide(
        a: &mut Approval,
        who: &str,
        id: &str,
        choice: Choice,
        at: DateTime<Utc>,
    ) -> Result<Decided, Refusal> {
        let roles: &[&str] = if who == "chen" { &[] } else { &["finance"] };
        a.decide(&person(who, roles), &request(id, choice), &policy(), at)
    }

    fn request(id: &str, choice: Choice) -> DecisionRequest {
        DecisionRequest {
            decision_id: DecisionId::parse(id).unwrap(),
            action_version: ActionVersion::FIRST,
            choice,
        }
    }

    #[test]
    fn an_approver_with_the_role_approves() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let decided = decide(&mut a, "dana", "d1", Choice::Approve, now).unwrap();
        assert!(
            matches!(decided, Decided::New { decision, .. } if decision.effect == DecisionEffect::Approved)
        );
        assert_eq!(a.status, ApprovalStatus::Approved);
        assert_eq!(
            a.authorized_by(),
            vec![Actor::person(&PersonId::parse("dana").unwrap())]
        );
    }

    #[test]
    fn the_requester_cannot_approve_their_own_request_even_with_the_role() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let refused = decide(&mut a, "ben", "d1", Choice::Approve, now);
        assert!(matches!(refused, Err(Refusal::OwnRequest { .. })));
        assert_eq!(a.status, ApprovalStatus::AwaitingApproval);
        assert!(a.decisions.is_empty());
    }

    #[test]
    fn someone_without_the_role_is_refused() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let refused = decide(&mut a, "chen", "d1", Choice::Approve, now);
        assert!(matches!(refused, Err(Refusal::MissingRole { .. })));
    }

    #[test]
    fn the_same_decision_id_returns_the_recorded_decision() {
        let now = Utc::now();
        let mut a = approval(1, now);
        decide(&mut a, "dana", "d1", Choice::Approve, now).unwrap();
        let again = decide(&mut a, "dana", "d1", Choice::Approve, now).unwrap();
        assert!(matches!(again, Decided::AlreadyRecorded(_)));
        assert_eq!(a.decisions.len(), 1);
        let reused = decide(
            &mut a,
            "dana",
            "d1",
            Choice::Reject {
                reason: "no".into(),
            },
            now,
        );
        assert!(matches!(reused, Err(Refusal::DecisionIdReused { .. })));
    }

    #[test]
    fn a_different_decision_on_a_resolved_approval_is_a_conflict() {
        let now = Utc::now();
        let mut a = approval(1, now);
        decide(&mut a, "dana", "d1", Choice::Approve, now).unwrap();
        let late = decide(&mut a, "erin", "d2", Choice::Approve, now);
        assert_eq!(
            late,
            Err(Refusal::AlreadyResolved {
                status: ApprovalStatus::Approved
            })
        );
    }

    #[test]
    fn a_quorum_of_two_needs_two_distinct_people() {
        let now = Utc::now();
        let mut a = approval(2, now);
        let first = decide(&mut a, "dana", "d1", Choice::Approve, now).unwrap();
        assert!(
            matches!(first, Decided::New { decision, .. } if decision.effect == DecisionEffect::Counted { still_needed: 1 })
        );
        let twice = decide(&mut a, "dana", "d2", Choice::Approve, now);
        assert!(matches!(twice, Err(Refusal::AlreadyApprovedBy { .. })));
        assert_eq!(a.status, ApprovalStatus::AwaitingApproval);
        decide(&mut a, "erin", "d3", Choice::Approve, now).unwrap();
        assert_eq!(a.status, ApprovalStatus::Approved);
        assert_eq!(a.approvers().len(), 2);
    }

    #[test]
    fn a_decision_after_the_deadline_expires_the_approval() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let late = now + Duration::hours(25);
        let refused = decide(&mut a, "dana", "d1", Choice::Approve, late);
        assert!(matches!(refused, Err(Refusal::Expired { .. })));
        assert_eq!(a.status, ApprovalStatus::Expired);
        assert!(a.decisions.is_empty());
    }

    #[test]
    fn a_stale_version_is_refused() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let mut stale = request("d1", Choice::Approve);
        stale.action_version = ActionVersion::FIRST.next();
        let refused = a.decide(&person("dana", &["finance"]), &stale, &policy(), now);
        assert!(matches!(refused, Err(Refusal::StaleVersion { .. })));
    }

    #[test]
    fn an_edit_lowers_the_amount_and_supersedes_the_version() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let edit = Choice::Edit {
            amount: Amount::from_dollars(200),
            note: Some("one night".into()),
        };
        let Decided::New {
            decision,
            edited_args,
        } = decide(&mut a, "dana", "d1", edit, now).unwrap()
        else {
            panic!("expected a new decision")
        };
        assert_eq!(
            decision.effect,
            DecisionEffect::Edited {
                new_version: ActionVersion::FIRST.next()
            }
        );
        assert_eq!(edited_args.unwrap().int("amount_cents"), Some(20_000));
        assert_eq!(a.status, ApprovalStatus::Superseded);
    }

    #[test]
    fn an_edit_that_raises_the_amount_changes_nothing() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let edit = Choice::Edit {
            amount: Amount::from_dollars(900),
            note: None,
        };
        let refused = decide(&mut a, "dana", "d1", edit, now);
        assert!(matches!(
            refused,
            Err(Refusal::Edit(EditRefusal::NotLower { .. }))
        ));
        assert_eq!(a.status, ApprovalStatus::AwaitingApproval);
        assert!(a.decisions.is_empty());
    }

    #[test]
    fn a_rejection_needs_a_reason() {
        let now = Utc::now();
        let mut a = approval(1, now);
        let blank = decide(
            &mut a,
            "dana",
            "d1",
            Choice::Reject { reason: " ".into() },
            now,
        );
        assert_eq!(blank, Err(Refusal::EmptyReason));
        decide(
            &mut a,
            "dana",
            "d2",
            Choice::Reject {
                reason: "dup".into(),
            },
            now,
        )
        .unwrap();
        assert_eq!(a.status, ApprovalStatus::Rejected);
    }

    #[test]
    fn the_sweep_expires_only_overdue_open_approvals() {
        let now = Utc::now();
        let mut a = approval(1, now);
        assert!(!a.expire(now));
        assert!(a.expire(now + Duration::hours(24)));
        assert!(
            !a.expire(now + Duration::hours(48)),
            "expiring twice does nothing"
        );
        assert!(!a.cancel(now));
    }

    #[test]
    fn a_reminder_is_due_once_the_lead_before_the_deadline() {
        let now = Utc::now();
        let lead = Duration::hours(1);
        let mut a = approval(1, now);
        assert_eq!(a.reminder_at(lead), Some(now + Duration::hours(23)));
        assert!(!a.remind(now + Duration::minutes(22 * 60 + 59), lead));
        assert!(a.remind(now + Duration::hours(23), lead));
        assert_eq!(a.reminded_at, Some(now + Duration::hours(23)));
        assert!(
            !a.remind(now + Duration::minutes(23 * 60 + 30), lead),
            "reminded once"
        );
    }

    #[test]
    fn no_reminder_for_a_decided_or_overdue_approval_or_one_shorter_than_the_lead() {
        let now = Utc::now();
        let lead = Duration::hours(1);
        let mut decided = approval(1, now);
        decided.cancel(now);
        assert!(!decided.remind(now + Duration::hours(23), lead));
        let mut overdue = approval(1, now);
        assert!(!overdue.remind(now + Duration::hours(24), lead));
        let mut short = approval(1, now);
        short.expires_at = now + Duration::minutes(45);
        assert_eq!(short.reminder_at(lead), None);
        assert!(!short.remind(now + Duration::minutes(30), lead));
    }

    #[test]
    fn an_approval_status_and_a_choice_read_as_their_records_store_them() {
        assert_eq!(ApprovalStatus::Answered.to_string(), "answered");
        let choice = Choice::DidNotTakeEffect { note: None };
        assert_eq!(
            serde_json::json!(choice.name()),
            serde_json::to_value(&choice).unwrap()["choice"]
        );
    }
}
