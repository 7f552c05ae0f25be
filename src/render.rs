//! Text for people. (`--json` prints the engine's own records instead.)

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use shared::domain::approval::{Approval, ApprovalKind, Choice, DecisionEffect};
use shared::domain::audit::{AuditEntry, AuditEvent};
use shared::domain::policy::Verdict;
use shared::domain::run::RunStatus;
use shared::engine::{DecisionReport, History, RunReport};
use shared::example::expense::{Settlement, SettlementOutcome};

/// `[run-…] done: …`, or paused with one line per approval it waits on.
pub fn run(report: &RunReport) -> String {
    let mut out = String::new();
    let id = &report.run_id;
    match report.status {
        RunStatus::Done => writeln!(
            out,
            "[{id}] done: {}",
            report.answer.as_deref().unwrap_or_default()
        ),
        RunStatus::Failed => writeln!(
            out,
            "[{id}] failed: {}",
            report.error.as_deref().unwrap_or_default()
        ),
        RunStatus::Cancelled => writeln!(out, "[{id}] cancelled"),
        RunStatus::Running => writeln!(out, "[{id}] running"),
        RunStatus::AwaitingApproval => {
            let _ = writeln!(out, "[{id}] paused, waiting for a reviewer:");
            for a in &report.approvals {
                let _ = writeln!(
                    out,
                    "  {}  {} {}  version {}  why: {}",
                    a.id, a.tool, a.args, a.action_version, a.reason
                );
            }
            Ok(())
        }
    }
    .expect("writing to a string");
    out
}

pub fn time_left(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let left = (expires_at - now).num_seconds();
    if left <= 0 {
        return "EXPIRED".into();
    }
    let (h, m, s) = (left / 3600, left % 3600 / 60, left % 60);
    match h {
        0 if m == 0 => format!("{s}s left"),
        0 => format!("{m}m {s}s left"),
        _ => format!("{h}h {m}m left"),
    }
}

fn who_may(a: &Approval) -> String {
    let not: Vec<String> = a.requested_by.iter().map(|p| p.to_string()).collect();
    let approved: Vec<String> = a.approvers().iter().map(|p| p.to_string()).collect();
    let mut text = format!("{} (not {})", a.approver_role, not.join(", "));
    let _ = write!(
        text,
        "; {} of {} approvals still needed",
        a.still_needed(),
        a.quorum
    );
    if !approved.is_empty() {
        let _ = write!(text, "; approved so far by {}", approved.join(", "));
    }
    text
}

pub fn pending(approvals: &[Approval], now: DateTime<Utc>) -> String {
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
            a.id, a.tool, a.action_version, a.run_id,
        );
        let _ = writeln!(out, "  agent:  {}", a.explanation);
        let _ = writeln!(out, "  call:   {} {}", a.tool, a.args);
        if let Some(previous) = &a.previous {
            let note = previous
                .note
                .as_deref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  edit:   {} changed version {} {}{note}",
                previous.edited_by, previous.version, previous.args
            );
        }
        let _ = writeln!(out, "  hash:   {}", a.args_hash);
        let _ = writeln!(out, "  why:    {}", a.reason);
        let _ = writeln!(out, "  who:    {}", who_may(a));
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

pub fn decision(report: &DecisionReport) -> String {
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
            a.tool,
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
        (Choice::Reject { reason }, _) => format!("{} rejected {}: {reason}", d.by, a.id),
        (_, DecisionEffect::Answered { took_effect }) => format!(
            "{} answered {}: {} {} {}",
            d.by,
            a.id,
            a.tool,
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
    match &report.run {
        Some(run) => out.push_str(&self::run(run)),
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

fn event_line(entry: &AuditEntry, tools: &std::collections::BTreeMap<String, String>) -> String {
    let tool = |action: &shared::domain::ids::ActionId| {
        tools.get(action.as_str()).cloned().unwrap_or_default()
    };
    match &entry.event {
        AuditEvent::Started {
            task,
            requested_by,
            policy_version,
        } => {
            format!("for {requested_by}: {task} (policy v{policy_version})")
        }
        AuditEvent::Proposed {
            tool,
            version,
            args,
            args_hash,
            verdict,
            approval_id,
            explanation,
            ..
        } => {
            let ruling = match verdict {
                Verdict::Allow => "allowed by policy".to_string(),
                Verdict::Deny { reason } => format!("denied by policy: {reason}"),
                Verdict::RequireApproval(r) => format!(
                    "needs {} {} approval{} ({}): {}",
                    r.quorum,
                    r.approver_role,
                    if r.quorum == 1 { "" } else { "s" },
                    approval_id
                        .as_ref()
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    r.reason
                ),
            };
            format!(
                "{tool} v{version} {args} {}\n{:>34}{ruling}\n{:>34}explanation: {explanation}",
                args_hash.short(),
                "",
                ""
            )
        }
        AuditEvent::Paused { approvals } => format!("waiting on {}", join(approvals)),
        AuditEvent::RecoveryRequested {
            approval_id,
            action_id,
            version,
            owner,
        } => format!(
            "{} {action_id}:{version}: did it take effect? asked of {owner} ({approval_id})",
            tool(action_id)
        ),
        AuditEvent::Notified {
            approval_id,
            notice,
            destination,
        } => format!("{notice} for {approval_id} sent to {destination}"),
        AuditEvent::NotificationFailed {
            approval_id,
            notice,
            destination,
            attempts,
            error,
        } => format!(
            "{notice} for {approval_id} to {destination} given up after {attempts} attempt{}: {}",
            if *attempts == 1 { "" } else { "s" },
            clip(error)
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
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                ),
                Choice::Reject { reason } => format!("reject: {reason}"),
                other => match other.text() {
                    Some(note) => format!("{} ({note})", other.name()),
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
        AuditEvent::Commented { approval_id, text } => format!("on {approval_id}: {text}"),
        AuditEvent::Escalated { approval_id, to } => {
            format!("{approval_id} escalated: {to} may decide it too")
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
                join(authorized_by)
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
                join(authorized_by),
                clip(result)
            )
        }
        AuditEvent::Unknown {
            action_id,
            version,
            detail,
        } => {
            format!(
                "{} {action_id}:{version} outcome unknown: {detail}",
                tool(action_id)
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
                clip(result)
            )
        }
        AuditEvent::Refused {
            tool, args, why, ..
        } => {
            let args = args.as_ref().map(|a| format!(" {}", clip(&a.canonical())));
            format!("{tool}{} refused: {why}", args.unwrap_or_default())
        }
        AuditEvent::Resumed { results } => format!(
            "{results} result{} back to the agent",
            if *results == 1 { "" } else { "s" }
        ),
        AuditEvent::Done { answer } => answer.clone(),
        AuditEvent::Failed { error } => error.clone(),
    }
}

/// Long tool results are cut in the text view; `--json` has them whole.
fn clip(text: &str) -> String {
    match text.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
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
        h.run.id, h.run.status, h.run.requested_by, h.run.task
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
            entry.actor.to_string(),
            event_line(entry, &tools)
        );
    }
    out
}

/// Payments made, then claims declined.
pub fn ledger(payments: &[Settlement], declined: &[Settlement]) -> String {
    let mut out = String::new();
    if payments.is_empty() {
        out.push_str("No payment has been made.\n");
    }
    let mut total = 0;
    for s in payments {
        if let SettlementOutcome::Paid { amount } = &s.outcome {
            total += amount.cents();
            let _ = writeln!(
                out,
                "{}  {:<6} {:>10}  by {} in {}",
                s.claim_id,
                s.employee.to_string(),
                amount.to_string(),
                s.idempotency_key,
                s.run_id
            );
        }
    }
    if !payments.is_empty() {
        let total = shared::domain::money::Amount::from_cents(total).expect("a sum of amounts");
        let _ = writeln!(
            out,
            "{:<13} {:>10}  in {} payment{}",
            "total",
            total.to_string(),
            payments.len(),
            if payments.len() == 1 { "" } else { "s" }
        );
    }
    for s in declined {
        if let SettlementOutcome::Declined { reason } = &s.outcome {
            let _ = writeln!(
                out,
                "declined {}  {}: {reason}  by {}",
                s.claim_id, s.employee, s.idempotency_key
            );
        }
    }
    out
}
