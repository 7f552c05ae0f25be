//! `--policy-eval`: what deciding one call costs, apart from the store: the shipped expense
//! policy (TOML rules, translated to Cedar) and a Cedar payments policy that reads arguments,
//! the requester's roles and claims, a history window and the time, each decided --runs times
//! over a mix of calls that reach every outcome. Prints p50, p99 and the mean per decision.

use std::collections::BTreeMap;
use std::time::Instant;

use chrono::Utc;
use serde_json::{Value, json};
use shared::domain::args::Args;
use shared::domain::policy::{CallFacts, Policy, Requester, ToolHints, Total, VerdictKind};

use crate::{BenchArgs, BenchError, Output};

const PAYMENTS_MANIFEST: &str = r#"
name = "payments"
version = 1
default_ttl = "4h"
cedar = ["rules.cedar"]

[history.sent_1h]
tool = "send_transfer"
window = "1h"
per = "requester"
sum = "amount_cents"
"#;

const PAYMENTS_RULES: &str = r#"
@id("small transfers")
permit(principal, action == Action::"send_transfer", resource)
when { context.input.amount_cents <= 50000 && context.history.sent_1h.sum + context.input.amount_cents <= 200000 };

@id("treasury transfers")
permit(principal, action == Action::"send_transfer", resource)
when { principal.hasTag("department") && principal.getTag("department") == "treasury" && context.input.amount_cents <= 100000 };

@id("large transfers") @approve("finance") @reason("Transfers above USD 500 need finance.")
permit(principal, action == Action::"send_transfer", resource)
when { context.input.amount_cents > 50000 || context.history.sent_1h.sum + context.input.amount_cents > 200000 };

@id("after hours") @approve("lead") @reason("Transfers out of hours need a lead.")
permit(principal, action == Action::"send_transfer", resource)
when { context.now.hour < 8 || context.now.hour >= 18 };

@id("no interns") @reason("Interns never move money.")
forbid(principal, action == Action::"send_transfer", resource)
when { principal.roles.contains("intern") };

@id("lead above 100") @mode("log_only") @approve("lead")
permit(principal, action == Action::"send_transfer", resource)
when { context.input.amount_cents > 10000 };
"#;

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
    let payments = Policy::load(PAYMENTS_MANIFEST, &mut |file| match file {
        "rules.cedar" => Ok(PAYMENTS_RULES.to_string()),
        other => Err(format!("no file {other}")),
    })
    .map_err(|e| setup(e.to_string()))?;

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
    let payments_calls = [
        (
            "send_transfer",
            json!({"to": "acct_9", "amount_cents": 9_000}),
        ),
        (
            "send_transfer",
            json!({"to": "acct_9", "amount_cents": 60_000}),
        ),
        (
            "send_transfer",
            json!({"to": "acct_7", "amount_cents": 90_000}),
        ),
    ];
    let figures = vec![
        measure(
            "expense (TOML)",
            &expense,
            "expense",
            &expense_calls,
            args.runs,
        )?,
        measure(
            "payments (Cedar, a window, claims, the time)",
            &payments,
            "payments",
            &payments_calls,
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
