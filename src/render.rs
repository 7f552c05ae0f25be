//! Text for people. (`--json` prints the engine's own records instead.)
//!
//! Every text that comes from data (an agent's words, a comment, a task, a reason, a tool's
//! result, a name) is printed through [`Plain`], so it shows its control characters escaped
//! and cannot move the cursor, rewrite a line, set the terminal's title or forge a line of its
//! own; [`terminal`] escapes what a whole output would still carry, line breaks aside.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use chrono::{DateTime, Utc};
use shared::domain::action::{Action, ActionStatus};
use shared::domain::approval::{Approval, ApprovalKind, Choice, DecisionEffect};
use shared::domain::audit::{AuditEntry, AuditEvent};
use shared::domain::ids::{ActionId, ApprovalId, Role, RunId};
use shared::domain::policy::{Requirement, Verdict, VerdictKind};
use shared::domain::run::RunStatus;
use shared::engine::{
    DecisionReport, Figures, History, PENDING_PAGE, PendingCursor, RunReport, SweepReport,
};
use shared::example::expense::{Settlement, SettlementOutcome};
use shared::logs::Escaping;
use shared::ports::counters::{
    DecisionOutcome, ExecutionOutcome, ModelOutcome, RuleMode, TokenKind,
};

/// Stored text as a terminal may print it: control characters (C0, DEL, C1, line breaks
/// included) and the characters that reorder text (bidirectional overrides and isolates) show
/// escaped, `\n`, `\r`, `\t` or `\u{1b}`; everything else as it is.
pub struct Plain<T>(pub T);

impl<T: fmt::Display> fmt::Display for Plain<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            Escaping {
                out: f,
                lines: false
            },
            "{}",
            self.0
        )
    }
}

/// A whole output as a terminal may print it: as [`Plain`], but its line breaks kept, where
/// the layout put them (text from data has had its own escaped already).
pub fn terminal(text: &str) -> String {
    shared::logs::escaped(text, true)
}

/// `[run-…] done: …`, or paused with one line per approval it waits on, or with the calls
/// whose outcome it waits for (`history`, where the caller read it, names them).
pub fn run(report: &RunReport, history: Option<&History>) -> String {
    let mut out = String::new();
    let id = &report.run_id;
    let unsettled: Vec<&Action> = history.map(unsettled).unwrap_or_default();
    match report.status {
        RunStatus::Done => writeln!(
            out,
            "[{id}] done: {}",
            Plain(report.answer.as_deref().unwrap_or_default())
        ),
        RunStatus::Failed => writeln!(
            out,
            "[{id}] failed: {}",
            Plain(report.error.as_deref().unwrap_or_default())
        ),
        RunStatus::Cancelled => writeln!(out, "[{id}] cancelled"),
        RunStatus::Running => writeln!(out, "[{id}] running"),
        RunStatus::AwaitingApproval if !report.approvals.is_empty() => {
            let _ = writeln!(out, "[{id}] paused, waiting for a reviewer:");
            for a in &report.approvals {
                let _ = writeln!(
                    out,
                    "  {}  {} {}  version {}  why: {}",
                    a.id,
                    Plain(&a.tool),
                    Plain(&a.args),
                    a.action_version,
                    Plain(&a.reason)
                );
            }
            Ok(())
        }
        RunStatus::AwaitingApproval => match (history, unsettled.is_empty()) {
            (Some(history), false) => {
                let _ = writeln!(out, "[{id}] paused, waiting for the outcome of a call:");
                for action in unsettled {
                    let _ = writeln!(out, "  {}", call(action, history));
                }
                Ok(())
            }
            _ => writeln!(
                out,
                "[{id}] paused: nothing waits for a reviewer; it resumes when its message is \
                 delivered (a worker, or the sweep: countersign review expire)"
            ),
        },
    }
    .expect("writing to a string");
    out
}

/// The newest version of each call of a run whose outcome is not settled yet.
fn unsettled(history: &History) -> Vec<&Action> {
    let mut newest: Vec<&Action> = Vec::new();
    for action in &history.actions {
        match newest.iter_mut().find(|a| a.id == action.id) {
            Some(kept) if kept.version < action.version => *kept = action,
            Some(_) => {}
            None => newest.push(action),
        }
    }
    newest.retain(|a| matches!(a.status, ActionStatus::Unknown | ActionStatus::Executing));
    newest
}

/// What became of one call version, in a line: its tool and key, then its outcome and, for
/// one not settled, who settles it.
pub fn call(action: &Action, history: &History) -> String {
    let head = format!("{} {}", Plain(&action.tool), action.key());
    let told = action
        .result
        .as_ref()
        .map(|r| clip(&r.content))
        .unwrap_or_default();
    let about = |event: &AuditEvent| event.action() == Some((&action.id, action.version));
    match action.status {
        ActionStatus::Succeeded => format!("{head} succeeded: {}", Plain(told)),
        ActionStatus::Failed => format!("{head} failed (the agent is told): {}", Plain(told)),
        ActionStatus::Unknown => {
            let detail = history.entries.iter().rev().find_map(|e| match &e.event {
                AuditEvent::Unknown { detail, .. } if about(&e.event) => Some(detail.as_str()),
                _ => None,
            });
            let recovery = history.entries.iter().rev().find_map(|e| match &e.event {
                AuditEvent::RecoveryRequested {
                    approval_id, owner, ..
                } if about(&e.event) => Some((approval_id, owner)),
                _ => None,
            });
            let settles = match recovery {
                Some((approval, owner)) => format!(
                    "{approval} asks the {owner} role whether it took effect (countersign review answer)"
                ),
                None => "the sweep asks its tool again, or, where it cannot be asked, the \
                         agent's recovery owner (countersign review expire)"
                    .into(),
            };
            format!(
                "{head} outcome unknown ({}): held for reconciliation; {settles}",
                Plain(detail.unwrap_or("no answer"))
            )
        }
        ActionStatus::Approved => format!("{head} approved: it runs when its run resumes"),
        ActionStatus::Executing => match action.caller_claim() {
            Some(claim) => format!(
                "{head} claimed by {} to run in its caller's process, no outcome reported yet (due by {})",
                Plain(&claim.claimant),
                claim.lease_expires_at.format("%Y-%m-%d %H:%M:%S UTC")
            ),
            None => format!("{head} running, no outcome recorded yet"),
        },
        ActionStatus::AwaitingApproval => format!("{head} waits for a reviewer"),
        ActionStatus::Superseded => format!("{head} superseded by an edit"),
        ActionStatus::Rejected | ActionStatus::Expired | ActionStatus::Cancelled => {
            format!("{head} {}, not run: {}", action.status, Plain(told))
        }
    }
}

pub fn time_left(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let left = (expires_at - now).num_seconds();
    if left <= 0 {
        return "EXPIRED".into();
    }
    format!("{} left", span(left))
}

/// A number of seconds as people read it: `42s`, `3m 5s`, `2h 10m`.
fn span(seconds: i64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    match h {
        0 if m == 0 => format!("{s}s"),
        0 => format!("{m}m {s}s"),
        _ => format!("{h}h {m}m"),
    }
}

/// The counts of `keys`, in order, as `1/0/2`.
fn slashed<K: Ord>(counts: &BTreeMap<K, u64>, keys: &[K]) -> String {
    let each: Vec<String> = keys
        .iter()
        .map(|k| counts.get(k).copied().unwrap_or(0).to_string())
        .collect();
    each.join("/")
}

/// `countersign stats`: one line per tenant and agent, what waits and what was counted.
pub fn stats(figures: &Figures) -> String {
    if figures.agents.is_empty() {
        return "nothing to show: no run has started here yet\n".into();
    }
    let mut rows = vec![
        [
            "TENANT",
            "AGENT",
            "WAITING",
            "OLDEST",
            "UNKNOWN",
            "DECIDED a/e/r/x",
            "RAN ok/failed/unknown",
            "POLICY allow/approve/deny",
            "MODEL ok/error",
            "TOKENS in/out",
            "RESUME FAILED",
        ]
        .map(String::from),
    ];
    for a in &figures.agents {
        let ruled = VerdictKind::ALL
            .map(|outcome| {
                a.policy_outcomes
                    .iter()
                    .filter(|r| r.outcome == outcome && r.mode == RuleMode::Enforce)
                    .map(|r| r.count)
                    .sum::<u64>()
                    .to_string()
            })
            .join("/");
        let oldest = match a.approvals_waiting {
            0 => "-".into(),
            _ => span(a.oldest_wait_seconds as i64),
        };
        rows.push([
            Plain(&a.tenant).to_string(),
            Plain(&a.agent).to_string(),
            a.approvals_waiting.to_string(),
            oldest,
            a.unknown_outcomes.to_string(),
            slashed(&a.decisions, &DecisionOutcome::ALL),
            slashed(&a.executions, &ExecutionOutcome::ALL),
            ruled,
            slashed(&a.model_requests, &ModelOutcome::ALL),
            slashed(&a.model_tokens, &TokenKind::ALL),
            a.resume_failures.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        let _ = writeln!(text, "{}", cells.join("  ").trim_end());
    }
    if !figures.counted {
        text.push_str("counts: this store keeps none; each AWS function reports its own\n");
    }
    text
}

fn who_may(a: &Approval) -> String {
    let roles: Vec<&Role> = std::iter::once(&a.approver_role)
        .chain(a.also.iter().map(|need| &need.role))
        .collect();
    let mut text = format!(
        "{} (not {})",
        Plain(&join(&roles).replace(", ", " and ")),
        Plain(join(&a.requested_by))
    );
    match a.also.is_empty() {
        true => {
            let _ = write!(
                text,
                "; {} of {} approvals still needed",
                a.still_needed(),
                a.quorum
            );
        }
        // Each role's count: every one must be met.
        false => {
            let counts: Vec<String> = roles
                .iter()
                .zip(a.needs())
                .map(|(role, (_, quorum, more))| format!("{role} {more} of {quorum}"))
                .collect();
            let _ = write!(
                text,
                "; approvals still needed: {}",
                Plain(&counts.join(", "))
            );
        }
    }
    let approved = a.approvers();
    if !approved.is_empty() {
        let _ = write!(text, "; approved so far by {}", Plain(join(&approved)));
    }
    text
}

/// What `review` says below a page that is not the last: how to see the rest. `again` is the
/// command that listed it, `limit` its page's size.
pub fn more(shown: usize, again: &str, limit: u32, next: &PendingCursor) -> String {
    let size = match limit as usize == PENDING_PAGE {
        true => String::new(),
        false => format!(" --limit {limit}"),
    };
    format!(
        "{shown} shown, soonest deadline first; more wait.\n\
         Next page: {again}{size} --cursor {}\n\
         Every one: {again} --all\n",
        next.encode()
    )
}

/// One card per approval: what it is for (`tasks`: each run's task, by run id), the agent's
/// words, the exact call, why a person decides (and by which rules), who may, and until when.
pub fn pending(
    approvals: &[Approval],
    tasks: &std::collections::BTreeMap<RunId, String>,
    now: DateTime<Utc>,
) -> String {
    if approvals.is_empty() {
        return "Nothing waits for a decision.\n".into();
    }
    let mut out = String::new();
    for a in approvals {
        let recovery = a.kind == ApprovalKind::Recovery;
        let when = match recovery {
            true => "DID IT TAKE EFFECT? (answer: review answer)".to_string(),
            false => time_left(a.expires_at, now),
        };
        let _ = writeln!(
            out,
            "{}  {}  version {}  run {}  {when}",
            a.id,
            Plain(&a.tool),
            a.action_version,
            a.run_id,
        );
        let task = tasks.get(&a.run_id).map(String::as_str);
        let _ = writeln!(
            out,
            "  task:   {} agent: {}",
            a.agent,
            Plain(task.unwrap_or("(its run cannot be read)"))
        );
        // An edited version's words are its editor's, not the agent's.
        let said_by = match a.previous {
            Some(_) => "editor: ",
            None => "agent:  ",
        };
        let _ = writeln!(out, "  {said_by}{}", Plain(&a.explanation));
        let _ = writeln!(out, "  call:   {} {}", Plain(&a.tool), Plain(&a.args));
        if let Some(previous) = &a.previous {
            let note = previous
                .note
                .as_deref()
                .map(|n| format!(": {}", Plain(n)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  edit:   {} changed version {} {}{note}",
                previous.edited_by,
                previous.version,
                Plain(&previous.args)
            );
        }
        let _ = writeln!(out, "  hash:   {}", a.args_hash);
        let _ = writeln!(out, "  why:    {}", Plain(&a.reason));
        if !a.rules.is_empty() {
            let _ = writeln!(out, "  rules:  {}", Plain(&a.rules.join(", ")));
        }
        let _ = writeln!(out, "  who:    {}", who_may(a));
        for comment in &a.comments {
            let _ = writeln!(out, "  comment: {}: {}", comment.by, Plain(&comment.text));
        }
        if recovery {
            continue;
        }
        let _ = writeln!(
            out,
            "  due:    {}",
            a.expires_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    out
}

/// The decision, what became of the call it let run (`history`: its run's, read after it),
/// and where the run stands. `caller_runs`: the call's tool is one its caller runs
/// (`executor = "caller"`), so an approved version waits for the caller's claim, not a resume.
pub fn decision(report: &DecisionReport, history: Option<&History>, caller_runs: bool) -> String {
    let mut out = String::new();
    let d = &report.decision;
    let a = &report.approval;
    let replay = if report.replayed {
        " (already recorded; nothing new)"
    } else {
        ""
    };
    let what = match (&d.choice, &d.effect) {
        (Choice::Approve, DecisionEffect::Counted { still_needed }) => {
            format!(
                "{} approved {}; {still_needed} more approval needed",
                d.by, a.id
            )
        }
        (Choice::Approve, _) => format!(
            "{} approved {} ({} version {}, {})",
            d.by,
            a.id,
            Plain(&a.tool),
            d.action_version,
            d.args_hash.short()
        ),
        (Choice::Edit { amount, .. }, DecisionEffect::Edited { new_version }) => {
            let next = match &report.next_approval {
                Some(next) if next.still_needed() > 0 => format!(
                    "; {} waits on {} more approval",
                    next.id,
                    next.still_needed()
                ),
                Some(next) => format!(", approved as {}", next.id),
                None => ", which policy allows".into(),
            };
            format!(
                "{} edited {} to {amount}: version {new_version}{next}",
                d.by, a.id
            )
        }
        (Choice::Reject { reason }, _) => {
            format!("{} rejected {}: {}", d.by, a.id, Plain(reason))
        }
        (_, DecisionEffect::Answered { took_effect }) => format!(
            "{} answered {}: {} {} {}",
            d.by,
            a.id,
            Plain(&a.tool),
            shared::domain::ids::idempotency_key(&a.action_id, a.action_version),
            if *took_effect {
                "took effect"
            } else {
                "did not take effect"
            }
        ),
        (choice, effect) => format!("{} {} {}: {effect:?}", d.by, choice.name(), a.id),
    };
    let _ = writeln!(out, "{what}{replay}");
    // The version the decision let run: the approved one, or the edit's.
    let ran = match &d.effect {
        DecisionEffect::Approved | DecisionEffect::Answered { .. } => Some(a.action_version),
        DecisionEffect::Edited { new_version } => Some(*new_version),
        DecisionEffect::Counted { .. } | DecisionEffect::Rejected => None,
    };
    let action = ran.and_then(|version| {
        history?
            .actions
            .iter()
            .find(|x| x.id == a.action_id && x.version == version)
    });
    // Approved for its caller, who claims it and runs it: nothing here resumes the run for it.
    let for_caller = action.filter(|a| caller_runs && a.status == ActionStatus::Approved);
    if let Some(action) = for_caller {
        let key = action.key();
        let _ = writeln!(
            out,
            "{} {key} approved: its caller claims it and runs it in its own process, once, with \
             the arguments {} and the key {key}, then reports the outcome",
            Plain(&action.tool),
            Plain(&action.args.canonical())
        );
        let _ = writeln!(
            out,
            "[{}] waits for its caller to claim the call (POST /gate/calls/{}/claim) and report \
             what it did",
            a.run_id, a.run_id
        );
        return out;
    }
    let mut told = None;
    if let (Some(action), Some(history)) = (action, history)
        && action.status != ActionStatus::AwaitingApproval
    {
        let _ = writeln!(out, "{}", call(action, history));
        told = Some(action);
    }
    // A run that waits only on the call just told of says so in a word.
    let waits_on_it = |run: &RunReport| {
        run.status == RunStatus::AwaitingApproval
            && run.approvals.is_empty()
            && history.is_some_and(|h| {
                unsettled(h)
                    .iter()
                    .map(|a| a.key())
                    .eq(told.map(Action::key))
            })
    };
    match &report.run {
        Some(run) if waits_on_it(run) => {
            let _ = writeln!(out, "[{}] paused until that outcome is settled", run.run_id);
        }
        Some(run) => out.push_str(&self::run(run, history)),
        None if a.status != shared::domain::approval::ApprovalStatus::AwaitingApproval
            && !report.replayed =>
        {
            let _ = writeln!(
                out,
                "[{}] queued: the run resumes when a worker takes its message",
                a.run_id
            );
        }
        None => {}
    }
    out
}

/// What one sweep did: `expired`, each approval it expired with where its run stands (`None`:
/// queued for a worker); `escalated`, each approval it escalated with the role it now also
/// goes to.
pub struct Swept<'a> {
    pub report: &'a SweepReport,
    pub expired: Vec<(Approval, Option<RunReport>)>,
    pub escalated: Vec<(ApprovalId, Option<Role>)>,
}

/// Everything the sweep did, a line each; "Nothing was due." only when it did nothing.
pub fn sweep(swept: &Swept<'_>) -> String {
    let mut out = String::new();
    let report = swept.report;
    for (approval, run) in &swept.expired {
        let _ = writeln!(
            out,
            "expired {} ({} version {})",
            approval.id,
            Plain(&approval.tool),
            approval.action_version
        );
        match run {
            Some(run) => out.push_str(&self::run(run, None)),
            None => {
                let _ = writeln!(
                    out,
                    "[{}] queued: the run resumes when a worker takes its message",
                    approval.run_id
                );
            }
        }
    }
    for approval in &report.reminded {
        let _ = writeln!(out, "reminded {approval}: its deadline is near");
    }
    for (approval, role) in &swept.escalated {
        let _ = match role {
            Some(role) => writeln!(
                out,
                "escalated {approval}: the {} role may decide it too",
                Plain(role)
            ),
            None => writeln!(out, "escalated {approval}"),
        };
    }
    let settled: [(&[String], &str, &str); 2] = [
        (
            &report.reconciled,
            "reconciled",
            "its tool said what became of it, and its run goes on",
        ),
        (
            &report.lost_reads,
            "failed",
            "a read whose answer was lost; nothing took effect, so nothing is left to reconcile",
        ),
    ];
    let handed_on: [(&[String], &str, &str); 3] = [
        (
            &report.to_recovery_owner,
            "to the recovery owner",
            "its tool cannot tell what became of it, so a person answers",
        ),
        (
            &report.resent,
            "sent again",
            "its resume message was not acted on, so its run goes on",
        ),
        (
            &report.resumes_given_up,
            "gave up resending",
            "its resume message waits in the dead-letter queue for an operator",
        ),
    ];
    let each = |out: &mut String, lines: &[(&[String], &str, &str)]| {
        for (keys, what, why) in lines {
            for key in keys.iter() {
                let _ = writeln!(out, "{what} {key}: {why}");
            }
        }
    };
    each(&mut out, &settled);
    for key in &report.unknown {
        let _ = match report.unowned.contains(key) {
            true => writeln!(
                out,
                "still unknown {key}: its tool cannot be asked and its agent names no recovery_owner; a person must settle it: name that role in the agent's definition, and the next sweep asks it"
            ),
            false => writeln!(out, "still unknown {key}: its tool is asked again later"),
        };
    }
    each(&mut out, &handed_on);
    if report.redelivered > 0 {
        let _ = writeln!(
            out,
            "delivered again {} resume message{} left undelivered: their runs go on",
            report.redelivered,
            if report.redelivered == 1 { "" } else { "s" }
        );
    }
    for run in &report.abandoned {
        let _ = writeln!(
            out,
            "abandoned {run}: the process driving it stopped, so it failed"
        );
    }
    for run in &report.redriven {
        let _ = writeln!(
            out,
            "driven again {run}: the process driving it stopped during a model turn, so its turns go on"
        );
    }
    let notices = &report.notices;
    if !notices.is_empty() {
        let _ = writeln!(
            out,
            "notices: {} sent, {} to try again, {} given up",
            notices.sent, notices.retrying, notices.failed
        );
    }
    if out.is_empty() {
        out.push_str("Nothing was due.\n");
    }
    out
}

/// The approvals a requirement needs: "1 finance approval", "2 finance approvals and 1
/// compliance approval".
fn needed(r: &Requirement) -> String {
    let each = |quorum: u8, role: &Role| {
        format!(
            "{quorum} {} approval{}",
            Plain(role),
            if quorum == 1 { "" } else { "s" }
        )
    };
    std::iter::once(each(r.quorum, &r.approver_role))
        .chain(r.also.iter().map(|need| each(need.quorum, &need.role)))
        .collect::<Vec<_>>()
        .join(" and ")
}

fn event_line(entry: &AuditEntry, tools: &std::collections::BTreeMap<String, String>) -> String {
    let tool = |action: &ActionId| Plain(tools.get(action.as_str()).cloned().unwrap_or_default());
    match &entry.event {
        AuditEvent::Started {
            task,
            requested_by,
            policy_version,
        } => {
            format!(
                "for {requested_by}: {} (policy v{policy_version})",
                Plain(task)
            )
        }
        AuditEvent::Proposed {
            tool,
            version,
            args,
            args_hash,
            verdict,
            approval_id,
            explanation,
            rules,
            log_only,
            ..
        } => {
            let mut ruling = match &**verdict {
                Verdict::Allow => "allowed by policy".to_string(),
                Verdict::Deny { reason } => format!("denied by policy: {}", Plain(reason)),
                Verdict::RequireApproval(r) => format!(
                    "needs {} ({}): {}",
                    needed(r),
                    approval_id
                        .as_ref()
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    Plain(&r.reason)
                ),
            };
            if !rules.is_empty() {
                ruling.push_str(&format!(" [rules: {}]", Plain(&rules.join(", "))));
            }
            let shadow = match log_only {
                Some(shadow) => format!(
                    "\n{:>34}log-only rules would {} [rules: {}]",
                    "",
                    shadow.outcome.name(),
                    Plain(&shadow.rules.join(", "))
                ),
                None => String::new(),
            };
            format!(
                "{} v{version} {} {}\n{:>34}{ruling}{shadow}\n{:>34}explanation: {}",
                Plain(tool),
                Plain(args),
                args_hash.short(),
                "",
                "",
                Plain(explanation)
            )
        }
        AuditEvent::Paused { approvals } => format!("waiting on {}", join(approvals)),
        AuditEvent::RecoveryRequested {
            approval_id,
            action_id,
            version,
            owner,
        } => format!(
            "{} {action_id}:{version}: did it take effect? asked of {} ({approval_id})",
            tool(action_id),
            Plain(owner)
        ),
        AuditEvent::Notified {
            approval_id,
            notice,
            destination,
        } => format!("{notice} for {approval_id} sent to {}", Plain(destination)),
        AuditEvent::NotificationFailed {
            approval_id,
            notice,
            destination,
            attempts,
            error,
        } => format!(
            "{notice} for {approval_id} to {} given up after {attempts} attempt{}: {}",
            Plain(destination),
            if *attempts == 1 { "" } else { "s" },
            Plain(clip(error))
        ),
        AuditEvent::Decision {
            approval_id,
            version,
            args_hash,
            choice,
            effect,
            ..
        } => {
            let chose = match choice {
                Choice::Approve => "approve".to_string(),
                Choice::Edit { amount, note } => format!(
                    "edit to {amount}{}",
                    note.as_deref()
                        .map(|n| format!(" ({})", Plain(n)))
                        .unwrap_or_default()
                ),
                Choice::Reject { reason } => format!("reject: {}", Plain(reason)),
                other => match other.text() {
                    Some(note) => format!("{} ({})", other.name(), Plain(note)),
                    None => other.name().to_string(),
                },
            };
            let effect = match effect {
                DecisionEffect::Counted { still_needed } => {
                    format!("counted, {still_needed} more needed")
                }
                DecisionEffect::Approved => "approved".into(),
                DecisionEffect::Rejected => "rejected".into(),
                DecisionEffect::Edited { new_version } => format!("superseded by v{new_version}"),
                DecisionEffect::Answered { took_effect: true } => "it took effect".into(),
                DecisionEffect::Answered { took_effect: false } => "it did not take effect".into(),
            };
            format!(
                "{chose} on {approval_id} v{version} {} → {effect}",
                args_hash.short()
            )
        }
        AuditEvent::Superseded {
            approval_id,
            version,
            by_version,
            new_approval_id,
            ..
        } => {
            let next = new_approval_id
                .as_ref()
                .map(|a| format!(" ({a})"))
                .unwrap_or_default();
            format!("{approval_id} v{version} superseded by v{by_version}{next}")
        }
        AuditEvent::Expired {
            approval_id,
            version,
            ..
        } => format!("{approval_id} v{version} expired"),
        AuditEvent::Cancelled { approvals } => {
            format!("run cancelled; approvals cancelled: {}", join(approvals))
        }
        AuditEvent::Commented { approval_id, text } => {
            format!("on {approval_id}: {}", Plain(text))
        }
        AuditEvent::Escalated { approval_id, to } => {
            format!("{approval_id} escalated: {} may decide it too", Plain(to))
        }
        AuditEvent::ResumeResent {
            action_id,
            version,
            resent,
        } => format!(
            "{} {action_id}:{version}: nothing acted on its resume message; sent again (re-send {resent})",
            tool(action_id)
        ),
        AuditEvent::ResumeGivenUp {
            action_id,
            version,
            resent,
        } => format!(
            "{} {action_id}:{version}: its resume message was not acted on after {resent} re-sends; it waits in the dead-letter queue for a person to move it back",
            tool(action_id)
        ),
        AuditEvent::Executing {
            action_id,
            version,
            args_hash,
            authorized_by,
        } => {
            format!(
                "{} {action_id}:{version} {} authorized by {}",
                tool(action_id),
                args_hash.short(),
                Plain(join(authorized_by))
            )
        }
        AuditEvent::Executed {
            action_id,
            version,
            authorized_by,
            succeeded,
            result,
        } => {
            let how = if *succeeded { "succeeded" } else { "failed" };
            format!(
                "{} {action_id}:{version} {how} (authorized by {}): {}",
                tool(action_id),
                Plain(join(authorized_by)),
                Plain(clip(result))
            )
        }
        AuditEvent::Unknown {
            action_id,
            version,
            detail,
        } => {
            format!(
                "{} {action_id}:{version} outcome unknown: {}",
                tool(action_id),
                Plain(detail)
            )
        }
        AuditEvent::Reconciled {
            action_id,
            version,
            succeeded,
            result,
        } => {
            let how = if *succeeded { "succeeded" } else { "failed" };
            format!(
                "{} {action_id}:{version} {how}: {}",
                tool(action_id),
                Plain(clip(result))
            )
        }
        AuditEvent::Refused {
            tool, args, why, ..
        } => {
            let args = args
                .as_ref()
                .map(|a| format!(" {}", Plain(clip(&a.canonical()))));
            format!(
                "{} refused before policy{}: {}",
                Plain(tool),
                args.unwrap_or_default(),
                Plain(why)
            )
        }
        AuditEvent::ModelTurn { usage, stop_reason } => {
            let count = |n: Option<u64>| n.map_or("?".to_string(), |n| n.to_string());
            format!(
                "{} answered ({}): {} tokens in, {} out",
                Plain(&usage.model),
                shared::domain::names::serde_name(stop_reason),
                count(usage.input_tokens),
                count(usage.output_tokens)
            )
        }
        AuditEvent::Resumed { why: Some(why), .. } => Plain(why).to_string(),
        AuditEvent::Resumed { results, why: None } => format!(
            "{results} result{} back to the agent",
            if *results == 1 { "" } else { "s" }
        ),
        AuditEvent::Done { answer } => Plain(answer).to_string(),
        AuditEvent::Failed { error } => Plain(error).to_string(),
    }
}

/// Long tool results are cut in the text view; `--json` has them whole.
fn clip(text: &str) -> String {
    match text.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn history(h: &History) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {} ({}) for {}: {}",
        h.run.id,
        h.run.status,
        h.run.requested_by,
        Plain(&h.run.task)
    );
    let tools = h
        .actions
        .iter()
        .map(|a| (a.id.to_string(), a.tool.clone()))
        .collect();
    for entry in &h.entries {
        let at = entry
            .at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let _ = writeln!(
            out,
            "{at}  {:<10} {:<8} {}",
            entry.event.name(),
            Plain(&entry.actor).to_string(),
            event_line(entry, &tools)
        );
    }
    out
}

/// The expense example's ledger: payments made, then claims declined. `expense` says whether
/// this process has the expense agent at all; the ledger knows nothing of other agents' calls.
pub fn ledger(payments: &[Settlement], declined: &[Settlement], expense: bool) -> String {
    let mut out = String::new();
    if payments.is_empty() && declined.is_empty() {
        out.push_str(match expense {
            true => {
                "The expense example's ledger is empty: no claim has been paid or declined. \
                 (It holds only the expense agent's claims; other agents' calls are in \
                 countersign audit.)\n"
            }
            false => {
                "There is no expense ledger here: the expense example is not loaded (see \
                 --agents). Other agents' calls are in countersign audit.\n"
            }
        });
        return out;
    }
    let mut total = 0;
    for s in payments {
        if let SettlementOutcome::Paid { amount } = &s.outcome {
            total += amount.cents();
            let _ = writeln!(
                out,
                "{}  {:<6} {:>10}  by {} in {}",
                Plain(&s.claim_id),
                s.employee.to_string(),
                amount.to_string(),
                Plain(&s.idempotency_key),
                s.run_id
            );
        }
    }
    match payments.len() {
        0 => out.push_str("No claim has been paid.\n"),
        n => {
            let total = shared::domain::money::Amount::from_cents(total).expect("a sum of amounts");
            let _ = writeln!(
                out,
                "{:<13} {:>10}  in {n} payment{}",
                "total",
                total.to_string(),
                if n == 1 { "" } else { "s" }
            );
        }
    }
    for s in declined {
        if let SettlementOutcome::Declined { reason } = &s.outcome {
            let _ = writeln!(
                out,
                "declined {}  {}: {}  by {}",
                Plain(&s.claim_id),
                s.employee,
                Plain(reason),
                Plain(&s.idempotency_key)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_shows_its_control_characters_escaped() {
        let text = "ok\u{1b}[2J\u{1b}]0;title\u{7}\rapproved by policy\nnext\t\u{9b}\u{202e}end";
        assert_eq!(
            Plain(text).to_string(),
            "ok\\u{1b}[2J\\u{1b}]0;title\\u{7}\\rapproved by policy\\nnext\\t\\u{9b}\\u{202e}end"
        );
    }

    #[test]
    fn the_sweep_says_everything_it_did_and_nothing_was_due_only_when_it_did_nothing() {
        let approval = |id: &str| ApprovalId::parse(id).unwrap();
        let report = SweepReport {
            reminded: vec![approval("ap-reminded")],
            escalated: vec![approval("ap-escalated")],
            redelivered: 2,
            reconciled: vec!["act-1:1".into()],
            lost_reads: vec!["act-6:1".into()],
            unknown: vec!["act-2:1".into(), "act-7:1".into()],
            unowned: vec!["act-7:1".into()],
            to_recovery_owner: vec!["act-3:1".into()],
            resent: vec!["act-4:1".into()],
            resumes_given_up: vec!["act-5:1".into()],
            abandoned: vec![RunId::parse("run-abandoned").unwrap()],
            redriven: vec![RunId::parse("run-redriven").unwrap()],
            notices: shared::engine::NoticeReport {
                sent: 3,
                retrying: 1,
                failed: 0,
            },
            ..SweepReport::default()
        };
        let swept = Swept {
            report: &report,
            expired: Vec::new(),
            escalated: vec![(approval("ap-escalated"), Some(Role::parse("cfo").unwrap()))],
        };

        let text = sweep(&swept);

        for line in [
            "reminded ap-reminded: its deadline is near",
            "escalated ap-escalated: the cfo role may decide it too",
            "reconciled act-1:1: its tool said what became of it, and its run goes on",
            "still unknown act-2:1: its tool is asked again later",
            "failed act-6:1: a read whose answer was lost; nothing took effect, so nothing is left to reconcile",
            "still unknown act-7:1: its tool cannot be asked and its agent names no recovery_owner; a person must settle it: name that role in the agent's definition, and the next sweep asks it",
            "to the recovery owner act-3:1: its tool cannot tell what became of it, so a person answers",
            "sent again act-4:1: its resume message was not acted on, so its run goes on",
            "gave up resending act-5:1: its resume message waits in the dead-letter queue for an operator",
            "delivered again 2 resume messages left undelivered: their runs go on",
            "abandoned run-abandoned: the process driving it stopped, so it failed",
            "driven again run-redriven: the process driving it stopped during a model turn, so its turns go on",
            "notices: 3 sent, 1 to try again, 0 given up",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} is not in:\n{text}"
            );
        }
        assert!(!text.contains("Nothing"), "{text}");
        let idle = SweepReport::default();
        let nothing = Swept {
            report: &idle,
            expired: Vec::new(),
            escalated: Vec::new(),
        };
        assert_eq!(sweep(&nothing), "Nothing was due.\n");
    }

    #[test]
    fn a_model_turn_says_which_model_answered_and_the_tokens_it_counted() {
        use shared::domain::conversation::{StopReason, TurnUsage};
        let event = AuditEvent::ModelTurn {
            usage: TurnUsage {
                model: "gpt-4o-2024-08-06".into(),
                input_tokens: Some(812),
                output_tokens: None,
            },
            stop_reason: StopReason::ToolUse,
        };
        let run = RunId::parse("run-1").unwrap();
        let entry = AuditEntry::new(
            &run,
            shared::domain::identity::Actor::Agent,
            event,
            chrono::Utc::now(),
        );
        assert_eq!(
            event_line(&entry, &Default::default()),
            "gpt-4o-2024-08-06 answered (tool_use): 812 tokens in, ? out"
        );
    }

    #[test]
    fn a_whole_output_keeps_its_line_breaks_and_escapes_the_rest() {
        assert_eq!(
            terminal("one\u{1b}[1m\ntwo\u{7}\r\n"),
            "one\\u{1b}[1m\ntwo\\u{7}\\r\n"
        );
        assert_eq!(
            terminal("plain, ünïcode, “quoted”\n"),
            "plain, ünïcode, “quoted”\n"
        );
    }
}
