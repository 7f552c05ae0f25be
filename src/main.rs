//! `countersign`: the embedded local mode's command line.

mod cli;
mod fail;
mod hook;
mod local;
mod mcp;
mod metrics;
mod otel;
mod policy;
mod render;
mod serve;
mod token;
mod worker;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _};
use serde_json::{Value, json};
use shared::domain::approval::{Approval, ApprovalStatus, Choice, DecisionRequest};
use shared::domain::ids::{ActionVersion, AgentName, ApprovalId, DecisionId, RunId, TenantId};
use shared::domain::run::RunStatus;
use shared::engine::{History, MAX_PENDING_PAGE, PendingCursor, RunReport, StartRun};
use shared::example::expense;
use shared::ports::tools::NotRunnableHere;
use tracing::Instrument as _;

use cli::{Cli, Command, Review};
use fail::Failure;
use local::Local;

/// glibc's malloc and free were an eighth of an embedded lifecycle's CPU; mimalloc takes about
/// a tenth off it (BENCHMARKS section 14).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a command prints: text for people, one JSON object for `--json`.
pub(crate) struct Output {
    pub(crate) text: String,
    pub(crate) json: Value,
}

fn json_of<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("reports serialize")
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let traces = otel::Traces::from_env();
    let layer = traces
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .map(otel::Traces::layer);
    shared::logs::to_stderr_beside("warn", layer);

    let json = cli.global.json;
    // Over stdio, stdout carries the MCP protocol and nothing else.
    // A hook's answer is its own JSON, or nothing.
    let quiet = matches!(cli.command, Command::Mcp(_) | Command::Hook(_));
    let hook = matches!(cli.command, Command::Hook(_));
    // A one-shot command is one trace; a long-lived one's traces start at its own spans (a
    // request, a run driven, a sweep).
    let lasting = matches!(
        cli.command,
        Command::Serve(_) | Command::Mcp(_) | Command::Worker { once: false }
    );
    let span = match (&traces, matches.subcommand_name()) {
        (Ok(Some(_)), Some(name)) if !lasting => otel::command_span(name),
        _ => tracing::Span::none(),
    };
    let (outcome, traces) = match traces {
        Ok(traces) => (run(cli).instrument(span).await, traces),
        Err(failure) => (Err(failure), None),
    };
    let exit = finish(outcome, json, quiet, hook);
    // The command's output is out before its last spans are sent.
    if let Some(traces) = traces {
        traces.shut_down().await;
    }
    exit
}

/// Prints what a command came to, as text or JSON, and the exit status for it.
fn finish(outcome: Result<Output, Failure>, json: bool, quiet: bool, hook: bool) -> ExitCode {
    match outcome {
        Ok(_) if quiet => ExitCode::SUCCESS,
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            let _ = match json {
                true => writeln!(stdout, "{}", output.json),
                false => write!(stdout, "{}", render::terminal(&output.text)),
            };
            ExitCode::SUCCESS
        }
        Err(failure) => {
            if json {
                println!(
                    "{}",
                    json!({"error": {"code": failure.code, "message": failure.message}})
                );
            }
            eprintln!("error: {}", render::terminal(&failure.message));
            // Claude Code takes exit 2 as a blocking error: a hook that cannot decide blocks.
            match hook {
                true => ExitCode::from(2),
                false => ExitCode::from(failure.exit as u8),
            }
        }
    }
}

/// One page of what waits in `tenants`, soonest deadline first: at most `limit`, those after
/// `after`, and where the next page starts if more wait.
async fn waiting_page(
    local: &Local,
    tenants: &[TenantId],
    after: Option<&PendingCursor>,
    limit: usize,
) -> Result<(Vec<Approval>, Option<PendingCursor>), Failure> {
    let mut approvals = Vec::new();
    let mut more = false;
    for tenant in tenants {
        let page = local.engine.pending_page(tenant, after, limit).await?;
        more |= page.next.is_some();
        approvals.extend(page.approvals.into_iter().map(|shown| shown.approval));
    }
    // Each tenant's list is in this order too: their pages merge into one.
    approvals.sort_by_key(PendingCursor::after);
    more |= approvals.len() > limit;
    approvals.truncate(limit);
    let next = approvals.last().filter(|_| more).map(PendingCursor::after);
    Ok((approvals, next))
}

/// Everything that waits in `tenants`, page after page.
async fn every_waiting(
    local: &Local,
    tenants: &[TenantId],
) -> Result<(Vec<Approval>, Option<PendingCursor>), Failure> {
    let mut approvals = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = waiting_page(local, tenants, after.as_ref(), MAX_PENDING_PAGE).await?;
        approvals.extend(page);
        match next {
            Some(next) => after = Some(next),
            None => return Ok((approvals, None)),
        }
    }
}

/// Whether `--agents` (comma-separated paths) already loads the definition in `dir`: it names
/// the directory itself or the directory of definitions holding it. Loading it twice would be
/// refused as two agents of one name.
fn already_loaded(agents: Option<&str>, dir: &std::path::Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    agents
        .into_iter()
        .flat_map(|paths| paths.split(','))
        .filter_map(|path| std::path::Path::new(path.trim()).canonicalize().ok())
        .any(|path| path == dir || Some(path.as_path()) == dir.parent())
}

async fn run(cli: Cli) -> Result<Output, Failure> {
    let mut cli = cli;
    // A definition's directory given to `run` or `mcp` is loaded with the others, unless they
    // hold it.
    let named = match &cli.command {
        Command::Run { agent, .. } => Some(agent),
        Command::Mcp(options) => Some(&options.agent),
        Command::Policy(policy) => Some(policy.agent()),
        Command::Hook(cli::Hook::ClaudeCode(options)) => Some(&options.agent),
        _ => None,
    };
    if let Some(agent) = named
        && std::path::Path::new(agent)
            .join(shared::agents::DEFINITION_FILE)
            .is_file()
        && !already_loaded(cli.global.agents.as_deref(), std::path::Path::new(agent))
    {
        let agent = agent.clone();
        cli.global.agents = Some(match cli.global.agents.take() {
            Some(paths) => format!("{paths},{agent}"),
            None => agent,
        });
    }
    // A hook's input is read, and refused if bad, before the state is opened.
    let event = match &cli.command {
        Command::Hook(_) => Some(hook::read_event(std::io::stdin().lock())?),
        _ => None,
    };
    let local = Local::connect(&cli.global, cli.command.environment()).await?;
    match cli.command {
        Command::Hook(cli::Hook::ClaudeCode(options)) => {
            hook::run(&local, &options, event.expect("read above")).await
        }
        Command::Agent { claim, ttl } => {
            let mut start = expense::task_for(&local.claims, &claim)?;
            local.loaded(&start.tenant, &start.agent)?;
            start.approval_ttl = ttl;
            start_run(&local, start).await
        }
        Command::Run {
            agent,
            task,
            person,
            ttl,
        } => {
            let who = local.identify(&person)?;
            let agent = agent_named(&agent)?;
            local.loaded(&who.tenant, &agent)?;
            let start = StartRun {
                approval_ttl: ttl,
                ..StartRun::for_person(&who, agent, task)
            };
            start_run(&local, start).await
        }
        Command::Review {
            action: None,
            person,
            limit,
            cursor,
            all,
        } => {
            let tenants = match &person {
                Some(name) => vec![local.identify(name)?.tenant],
                None => local.tenants().await?,
            };
            let after = cursor
                .as_deref()
                .map(PendingCursor::parse)
                .transpose()
                .map_err(|e| Failure::usage(e.to_string()))?;
            let (approvals, next) = match all {
                true => every_waiting(&local, &tenants).await?,
                false => waiting_page(&local, &tenants, after.as_ref(), limit as usize).await?,
            };
            let mut tasks = std::collections::BTreeMap::new();
            for tenant in &tenants {
                let runs = approvals.iter().filter(|a| a.tenant == *tenant);
                tasks.extend(local.engine.tasks(tenant, runs.map(|a| &a.run_id)).await?);
            }
            let now = local.engine.now();
            let listed: Vec<Value> = approvals
                .iter()
                .map(|a| {
                    let mut listed = json_of(a);
                    listed["task"] = json!(tasks.get(&a.run_id));
                    listed
                })
                .collect();
            let mut text = render::pending(&approvals, &tasks, now);
            if let Some(next) = &next {
                let again = match &person {
                    Some(name) => format!("countersign review --as {name}"),
                    None => "countersign review".to_string(),
                };
                text.push_str(&render::more(approvals.len(), &again, limit, next));
            }
            let next_cursor = next.map(|next| next.encode());
            Ok(Output {
                text,
                json: json!({"approvals": listed, "now": now, "next_cursor": next_cursor}),
            })
        }
        Command::Review {
            action: Some(Review::Expire),
            ..
        } => expire(&local).await,
        Command::Review {
            action: Some(review),
            ..
        } => decide(&local, review).await,
        Command::Mcp(options) => {
            mcp::run(local, &cli.global, options).await?;
            Ok(Output {
                text: String::new(),
                json: json!({"stopped": true}),
            })
        }
        Command::Serve(options) => {
            serve::run(local, &cli.global.state, options).await?;
            Ok(Output {
                text: String::new(),
                json: json!({"stopped": true}),
            })
        }
        Command::Token { person, ttl } => {
            let token = token::issue(&local, &cli.global.state, &person, ttl)?;
            Ok(Output {
                text: format!("{}\n", token["token"].as_str().unwrap_or_default()),
                json: token,
            })
        }
        Command::Cancel { run, person } => {
            let who = local.identify(&person)?;
            let report = local.engine.cancel(&who, &RunId::parse(&run)?).await?;
            let text = format!("[{}] cancelled by {}\n", report.run_id, who.person);
            Ok(Output {
                text,
                json: json_of(&report),
            })
        }
        Command::Audit { id } => {
            let mut found = None;
            for tenant in local.tenants().await? {
                let history = if id.starts_with(ApprovalId::PREFIX) {
                    local
                        .engine
                        .history_of_approval(&tenant, &ApprovalId::parse(&id)?)
                        .await
                } else {
                    local.engine.history(&tenant, &RunId::parse(&id)?).await
                };
                match history {
                    Ok(history) => {
                        found = Some(history);
                        break;
                    }
                    Err(e) if e.code() == "not_found" => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let history =
                found.ok_or_else(|| Failure::from(shared::engine::EngineError::not_found(&id)))?;
            Ok(Output {
                text: render::history(&history),
                json: json_of(&history),
            })
        }
        Command::Worker { once } => worker::run(&local, once).await,
        Command::Policy(command) => policy::run(&local, command).await,
        Command::Stats { tenant } => {
            let tenant = tenant.as_deref().map(TenantId::parse).transpose()?;
            let figures = local.engine.figures(tenant.as_ref()).await?;
            Ok(Output {
                text: render::stats(&figures),
                json: json_of(&figures),
            })
        }
        Command::Ledger => {
            let mut settlements = Vec::new();
            for tenant in local.tenants().await? {
                settlements.extend(
                    local
                        .ledger
                        .all(&tenant)
                        .await
                        .map_err(shared::engine::EngineError::from)?,
                );
            }
            let (payments, declined): (Vec<_>, Vec<_>) = settlements
                .into_iter()
                .partition(|s| matches!(s.outcome, expense::SettlementOutcome::Paid { .. }));
            let expense = local
                .engine
                .agents()
                .contains(&AgentName::parse(expense::AGENT)?);
            let text = render::ledger(&payments, &declined, expense);
            Ok(Output {
                text,
                json: json!({"payments": payments, "declined": declined}),
            })
        }
    }
}

/// The agent `text` names: a loaded definition's name, or a definition's directory (loaded
/// with the others by [`run`]).
pub(crate) fn agent_named(text: &str) -> Result<AgentName, Failure> {
    match std::path::Path::new(text).join(shared::agents::DEFINITION_FILE) {
        file if file.is_file() => Ok(shared::agents::Definition::load(&shared::agents::Dir(
            std::path::PathBuf::from(text),
        ))
        .map_err(|e| Failure::usage(e.to_string()))?
        .name),
        _ => Ok(AgentName::parse(text)?),
    }
}

/// Starts a run, its agent's tools prepared first.
async fn start_run(local: &Local, start: StartRun) -> Result<Output, Failure> {
    shared::agents::prepare(&local.engine, &start.tenant, &start.agent).await?;
    let report = local.engine.start(start).await?;
    let history = waits_on_calls(local, &report).await;
    Ok(Output {
        text: render::run(&report, history.as_ref()),
        json: json_of(&report),
    })
}

/// The run's history, when it waits on something other than a reviewer (a call whose outcome
/// is unknown), so its text can say what.
async fn waits_on_calls(local: &Local, report: &RunReport) -> Option<History> {
    let waits = report.status == RunStatus::AwaitingApproval && report.approvals.is_empty();
    match waits {
        true => local
            .engine
            .history(&report.tenant, &report.run_id)
            .await
            .ok(),
        false => None,
    }
}

/// `review expire`: one sweep, and what became of each run it expired an approval of.
async fn expire(local: &Local) -> Result<Output, Failure> {
    let report = local.engine.sweep(1_000).await?;
    let tenants = local.tenants().await?;
    let mut agents = Vec::new();
    let mut swept = render::Swept {
        report: &report,
        expired: Vec::new(),
        escalated: Vec::new(),
    };
    let mut runs = Vec::new();
    for approval_id in &report.expired {
        let Some(approval) = find_approval(local, &tenants, approval_id).await else {
            continue;
        };
        let of = (approval.tenant.clone(), approval.agent.clone());
        if !agents.contains(&of) {
            agents.push(of);
        }
        let run = local.engine.run(&approval.tenant, &approval.run_id).await?;
        let run = shared::engine::RunReport::of(&run, vec![]);
        runs.push(run.clone());
        let queued = run.status == RunStatus::AwaitingApproval && local.aws.is_some();
        swept.expired.push((approval, (!queued).then_some(run)));
    }
    for approval_id in &report.escalated {
        let role = find_approval(local, &tenants, approval_id)
            .await
            .and_then(|a| a.escalated_to.last().cloned());
        swept.escalated.push((approval_id.clone(), role));
    }
    let mut text = render::sweep(&swept);
    let mut waiting = Vec::new();
    for (tenant, agent) in &agents {
        if let Some(missing) = waits_for_environment(local, tenant, agent) {
            text.push_str(&environment_note(&missing));
            waiting.push(missing_json(&missing));
        }
    }
    Ok(Output {
        text,
        json: json!({"sweep": report, "runs": runs, "waits_for_environment": waiting}),
    })
}

/// In the embedded mode, what this process lacks to resume a run of `agent` and run its calls
/// (a variable its bindings read): the decision or expiry it recorded waits, nothing claimed,
/// for a process that has it. `None` where it can, or where a queue's consumer resumes runs.
fn waits_for_environment(
    local: &Local,
    tenant: &TenantId,
    agent: &AgentName,
) -> Option<NotRunnableHere> {
    if local.aws.is_some() {
        return None;
    }
    let agent = local.engine.agent(tenant, agent).ok()?;
    agent.tools.all_run_here().err()
}

/// What [`waits_for_environment`] found, said to a person with what runs the call instead.
fn environment_note(missing: &NotRunnableHere) -> String {
    format!(
        "waits for the agent's environment: {missing}; nothing was claimed or sent. \
         `countersign serve` (its sweep) or `countersign review expire`, run where {} is set, \
         resumes the run and runs an approved call once.\n",
        missing.var
    )
}

/// [`waits_for_environment`]'s finding as `--json` gives it.
fn missing_json(missing: &NotRunnableHere) -> Value {
    json!({"variable": missing.var, "field": missing.field, "message": missing.to_string()})
}

/// An approval of one of the tenants, by id.
async fn find_approval(
    local: &Local,
    tenants: &[TenantId],
    id: &ApprovalId,
) -> Option<shared::domain::approval::Approval> {
    for tenant in tenants {
        if let Ok(approval) = local.engine.approval(tenant, id).await {
            return Some(approval);
        }
    }
    None
}

async fn decide(local: &Local, review: Review) -> Result<Output, Failure> {
    let (submission, choice) = match review {
        Review::Approve { submission } => (submission, Choice::Approve),
        Review::Edit {
            amount,
            note,
            submission,
        } => (submission, Choice::Edit { amount, note }),
        Review::Reject { reason, submission } => (submission, Choice::Reject { reason }),
        Review::Answer {
            took_effect,
            note,
            submission,
            ..
        } => {
            let choice = match took_effect {
                true => Choice::TookEffect { note },
                false => Choice::DidNotTakeEffect { note },
            };
            (submission, choice)
        }
        Review::Expire => unreachable!("handled by the caller"),
    };
    let approval_id = ApprovalId::parse(&submission.approval)?;
    let who = local.identify(&submission.person)?;
    let approval = local.engine.approval(&who.tenant, &approval_id).await?;
    local.loaded(&who.tenant, &approval.agent)?;
    let action_version = match submission.version {
        Some(v) => ActionVersion::new(v)?,
        // The approval id names one action version; deciding it by id decides that version.
        None => approval.action_version,
    };
    let decision_id = match submission.decision_id {
        Some(id) => DecisionId::parse(&id)?,
        None => DecisionId::parse(&format!(
            "cli-{}",
            ApprovalId::generate().as_str().trim_start_matches("ap-")
        ))?,
    };
    let request = DecisionRequest {
        decision_id,
        action_version,
        choice,
    };
    let report = local.engine.decide(&who, &approval_id, request).await?;
    // What became of the call it let run, read back from the run's history.
    let history = local
        .engine
        .history(&who.tenant, &report.approval.run_id)
        .await
        .ok();
    let (tenant, agent) = (&report.approval.tenant, &report.approval.agent);
    let caller_runs = local
        .engine
        .agent(tenant, agent)
        .is_ok_and(|agent| agent.caller_lease(&report.approval.tool).is_some());
    let mut text = render::decision(&report, history.as_ref(), caller_runs);
    let mut json = json_of(&report);
    // A decision that settled its approval resumes the run, where this process can.
    let waiting = |a: &Approval| a.status == ApprovalStatus::AwaitingApproval;
    let resumes = !waiting(&report.approval) && !report.next_approval.as_ref().is_some_and(waiting);
    if resumes && let Some(missing) = waits_for_environment(local, tenant, agent) {
        text.push_str(&environment_note(&missing));
        json["waits_for_environment"] = missing_json(&missing);
    }
    Ok(Output { text, json })
}
