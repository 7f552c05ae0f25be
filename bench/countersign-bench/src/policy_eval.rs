//! `--policy-eval`: what deciding one call costs, apart from the store: the shipped expense
//! policy (TOML rules, translated to Cedar) and two of the cookbook's Cedar policies (patterns
//! on a shell command, a history window), each decided --runs times over a mix of calls that
//! reach their outcomes, as requesters of other roles and claims. Prints p50, p99 and the mean
//! per decision.

use std::collections::BTreeMap;
use std::time::Instant;

use chrono::Utc;
use serde_json::{Value, json};
use shared::domain::args::Args;
use shared::domain::policy::{CallFacts, Policy, Requester, ToolHints, Total, VerdictKind};

use crate::{BenchArgs, BenchError, Output};

/// A policy of the cookbook (examples/policies), its manifest and its Cedar file.
fn recipe(manifest: &str, rules: &'static str) -> Result<Policy, BenchError> {
    Policy::load(manifest, &mut |file| match file {
        "rules.cedar" => Ok(rules.to_string()),
        other => Err(format!("no file {other}")),
    })
    .map_err(|e| BenchError::Setup(e.to_string()))
}

/// One policy's figures.
#[derive(Debug, serde::Serialize)]
struct Figures {
    policy: &'static str,
    decisions: usize,
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
    allow: usize,
    approve: usize,
    deny: usize,
}

pub fn run(args: &BenchArgs) -> Result<Output, BenchError> {
    let setup = |e: String| BenchError::Setup(e);
    let expense_text = include_str!("../../../agents/expense/policy.toml");
    let expense = Policy::load(expense_text, &mut |file| Err(format!("no file {file}")))
        .map_err(|e| setup(e.to_string()))?;
    let git_push = recipe(
        include_str!("../../../examples/policies/git-push/policy.toml"),
        include_str!("../../../examples/policies/git-push/rules.cedar"),
    )?;
    let daily_total = recipe(
        include_str!("../../../examples/policies/daily-total/policy.toml"),
        include_str!("../../../examples/policies/daily-total/rules.cedar"),
    )?;
    let expense_calls = [
        ("get_claim", json!({"claim_id": "c-102"})),
        (
            "reimburse",
            json!({"claim_id": "c-101", "amount_cents": 4_200, "note": "Within policy."}),
        ),
        (
            "reimburse",
            json!({"claim_id": "c-102", "amount_cents": 25_000, "note": "One night."}),
        ),
        (
            "reimburse",
            json!({"claim_id": "c-104", "amount_cents": 150_000, "note": "Team dinner."}),
        ),
        (
            "decline",
            json!({"claim_id": "c-103", "reason": "A duplicate."}),
        ),
    ];
    let bash_calls = [
        ("Bash", json!({"command": "cargo test -p shared"})),
        (
            "Bash",
            json!({"command": "git push origin feature/invoices"}),
        ),
        ("Bash", json!({"command": "git push origin HEAD:main"})),
        (
            "Bash",
            json!({"command": "git push --force origin fix-login"}),
        ),
    ];
    let credit_calls = [
        (
            "issue_credit",
            json!({"customer_id": "cus_1", "amount_cents": 5_000, "reason": "Late delivery."}),
        ),
        (
            "issue_credit",
            json!({"customer_id": "cus_2", "amount_cents": 15_000, "reason": "Broken item."}),
        ),
    ];
    let figures = vec![
        measure(
            "expense (TOML, translated)",
            &expense,
            "expense",
            &expense_calls,
            args.runs,
        )?,
        measure(
            "git-push (Cedar patterns on a command)",
            &git_push,
            "git-push",
            &bash_calls,
            args.runs,
        )?,
        measure(
            "daily-total (Cedar, a history window)",
            &daily_total,
            "daily-total",
            &credit_calls,
            args.runs,
        )?,
    ];

    let mut text = format!(
        "Policy evaluation, {} decisions a policy (one process, no store):\n",
        args.runs
    );
    text.push_str(&format!(
        "  {:<46} {:>9} {:>9} {:>9}   {}\n",
        "policy", "p50 us", "p99 us", "mean us", "allow/approve/deny"
    ));
    for f in &figures {
        text.push_str(&format!(
            "  {:<46} {:>9.1} {:>9.1} {:>9.1}   {}/{}/{}\n",
            f.policy, f.p50_us, f.p99_us, f.mean_us, f.allow, f.approve, f.deny
        ));
    }
    Ok(Output {
        text,
        json: json!({ "policy_eval": figures }),
    })
}

/// Decides `calls` in turn, `runs` times in all, as several requesters at several totals.
fn measure(
    name: &'static str,
    policy: &Policy,
    agent: &str,
    calls: &[(&str, Value)],
    runs: usize,
) -> Result<Figures, BenchError> {
    let args: Vec<(&str, Args)> = calls
        .iter()
        .map(|(tool, value)| Ok((*tool, Args::new(value.clone())?)))
        .collect::<Result<_, shared::domain::args::ArgsError>>()
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let requesters = [
        Requester {
            name: "ana",
            tenant: "acme",
            roles: vec!["employee"],
            claims: vec![],
        },
        Requester {
            name: "tia",
            tenant: "acme",
            roles: vec!["employee"],
            claims: vec![("department", "treasury".to_string())],
        },
        Requester {
            name: "ivo",
            tenant: "acme",
            roles: vec!["intern"],
            claims: vec![],
        },
    ];
    let totals: Vec<BTreeMap<String, Total>> = [0, 150_000]
        .into_iter()
        .map(|sum| {
            policy
                .history
                .keys()
                .map(|name| (name.clone(), Total { count: 3, sum }))
                .collect()
        })
        .collect();
    // Within business hours, so that every rule's edge is reached.
    let at = Utc::now()
        .date_naive()
        .and_hms_opt(12, 0, 0)
        .expect("noon exists")
        .and_utc();
    let mut took = Vec::with_capacity(runs);
    let mut outcomes = [0usize; 3];
    for i in 0..runs {
        let (tool, args) = &args[i % args.len()];
        let facts = CallFacts {
            tool,
            args,
            hints: ToolHints::default(),
            agent,
            requester: &requesters[(i / args_len(calls)) % requesters.len()],
            history: &totals[i % totals.len()],
            at,
        };
        let started = Instant::now();
        let ruling = std::hint::black_box(policy.decide(std::hint::black_box(&facts)));
        took.push(started.elapsed().as_secs_f64() * 1e6);
        match VerdictKind::of(&ruling.verdict) {
            VerdictKind::Allow => outcomes[0] += 1,
            VerdictKind::Approve => outcomes[1] += 1,
            VerdictKind::Deny => outcomes[2] += 1,
        }
    }
    took.sort_by(f64::total_cmp);
    let at_share = |share: f64| took[((took.len() - 1) as f64 * share).round() as usize];
    Ok(Figures {
        policy: name,
        decisions: runs,
        p50_us: at_share(0.5),
        p99_us: at_share(0.99),
        mean_us: took.iter().sum::<f64>() / took.len() as f64,
        allow: outcomes[0],
        approve: outcomes[1],
        deny: outcomes[2],
    })
}

fn args_len(calls: &[(&str, Value)]) -> usize {
    calls.len().max(1)
}
