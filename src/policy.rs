//! `countersign policy`: an agent's policy held to its case file, and a candidate policy tried
//! on the calls the agent was really asked to make.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;
use shared::agents::{Definition, Dir};
use shared::domain::policy::VerdictKind;
use shared::domain::policy::cases::{Cases, Failure as CaseFailure};
use shared::engine::{Agent, Replay};

use crate::cli::PolicyCommand;
use crate::fail::Failure;
use crate::local::Local;
use crate::render::Plain;
use crate::{Output, agent_named};

pub async fn run(local: &Local, command: PolicyCommand) -> Result<Output, Failure> {
    let name = agent_named(command.agent())?;
    let agent = local
        .engine
        .agents()
        .iter()
        .find(|agent| agent.name == name)
        .ok_or_else(|| {
            Failure::usage(format!(
                "no agent {name} is loaded: give its definition's directory to --agent"
            ))
        })?;
    match command {
        PolicyCommand::Test { cases, .. } => test(local, agent, &cases),
        PolicyCommand::Replay {
            agent: dir,
            policy,
            since,
        } => {
            let candidate = match &policy {
                Some(path) => {
                    let definition = Definition::load(&Dir(Path::new(&dir).to_path_buf()))
                        .map_err(|e| {
                            Failure::usage(format!(
                                "--policy needs --agent to be the agent's directory: {e}"
                            ))
                        })?;
                    let roles = local.directory.roles();
                    shared::agents::candidate_policy(path, agent, &definition, Some(&roles))
                        .map_err(|e| Failure::usage(e.to_string()))?
                }
                None => (*agent.policy).clone(),
            };
            let since = chrono::Utc::now()
                - chrono::Duration::from_std(since)
                    .map_err(|_| Failure::usage("--since is too long"))?;
            let replay = local.engine.replay_policy(agent, &candidate, since).await?;
            Ok(Output {
                text: replayed(&replay),
                json: serde_json::to_value(&replay).expect("reports serialize"),
            })
        }
    }
}

/// Runs the case file: the count that held, or every case that did not as the failure.
fn test(local: &Local, agent: &Agent, path: &Path) -> Result<Output, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(format!("cannot read the case file {}: {e}", path.display()))
    })?;
    let cases =
        Cases::from_toml(&text).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    if cases.cases.is_empty() {
        return Err(Failure::usage(format!(
            "{} has no [[case]]: each names a tool, its args, who asks (as) and what to expect",
            path.display()
        )));
    }
    let failures = agent.run_cases(&cases, &local.directory);
    if failures.is_empty() {
        let held = cases.cases.len();
        return Ok(Output {
            text: format!("{held} of {held} cases hold for {}\n", agent.name),
            json: json!({"agent": agent.name, "cases": held, "failed": []}),
        });
    }
    let mut message = format!(
        "{} of {} cases fail for {}:",
        failures.len(),
        cases.cases.len(),
        agent.name
    );
    for failure in &failures {
        message.push_str(&failed(failure));
    }
    Err(Failure {
        code: "policy_cases_failed",
        message,
        exit: 1,
    })
}

/// One failing case: what was wrong, and what policy decided and by which rules.
fn failed(failure: &CaseFailure) -> String {
    let mut out = format!("\n- {}", Plain(&failure.case));
    for problem in &failure.problems {
        let _ = write!(out, "\n    {}", Plain(problem));
    }
    if let Some(ruling) = &failure.ruling {
        let rules = match ruling.rules.is_empty() {
            true => "no rule matched".to_string(),
            false => format!("rules: {}", ruling.rules.join(", ")),
        };
        let _ = write!(
            out,
            "\n    decided {} ({})",
            kind(VerdictKind::of(&ruling.verdict)),
            Plain(rules)
        );
    }
    out
}

fn kind(kind: VerdictKind) -> &'static str {
    match kind {
        VerdictKind::Allow => "allow",
        VerdictKind::Approve => "approve",
        VerdictKind::Deny => "deny",
    }
}

/// The replay's text: outcomes per tool before and after, then each call that would change.
fn replayed(replay: &Replay) -> String {
    if replay.calls == 0 {
        return "No stored calls of this agent in that time: nothing to replay.\n".into();
    }
    let mut out = format!(
        "{} calls decided again; {} would change.\n",
        replay.calls,
        replay.changed.len()
    );
    let _ = writeln!(out, "{:<24} {:<22}   after", "", "before");
    let _ = writeln!(
        out,
        "{:<24} {:>8} {:>7} {:>5}   {:>8} {:>7} {:>5}",
        "tool", "allow", "approve", "deny", "allow", "approve", "deny"
    );
    for (tool, compared) in &replay.tools {
        let (b, a) = (compared.before, compared.after);
        let _ = writeln!(
            out,
            "{:<24} {:>8} {:>7} {:>5}   {:>8} {:>7} {:>5}",
            Plain(tool).to_string(),
            b.allow,
            b.approve,
            b.deny,
            a.allow,
            a.approve,
            a.deny
        );
    }
    for change in &replay.changed {
        let _ = writeln!(
            out,
            "{} {} {} by {} at {}: {} -> {} ({}) {}",
            change.run_id,
            change.action_id,
            Plain(&change.tool),
            change.requested_by,
            change.at.format("%Y-%m-%d %H:%M:%S"),
            kind(change.before),
            kind(change.after),
            Plain(match change.rules.is_empty() {
                true => "no rule matched".to_string(),
                false => change.rules.join(", "),
            }),
            Plain(change.args.canonical())
        );
    }
    out
}
