//! What a million approvals cost on AWS, from the requests and request units measured per
//! start, decision and resume, next to Step Functions' callback pattern.
//!
//! Prices: us-east-1, on-demand, without free tiers, as published when read (2026-11-29);
//! BENCHMARKS.md names the pages.

use serde::Serialize;

use crate::report::StepCost;

/// DynamoDB on-demand, per write request unit.
const WRU_USD: f64 = 0.625 / 1e6;
/// DynamoDB on-demand, per read request unit.
const RRU_USD: f64 = 0.125 / 1e6;
/// SQS FIFO, per request (each 64 KB chunk of a payload is one; ours are far smaller).
const SQS_FIFO_USD: f64 = 0.50 / 1e6;
/// Lambda, per request.
const LAMBDA_REQUEST_USD: f64 = 0.20 / 1e6;
/// Lambda on arm64, per GB-second.
const LAMBDA_ARM_GB_SECOND_USD: f64 = 0.000_013_333_4;
/// EventBridge Scheduler, per scheduled invocation (API calls are not billed).
const SCHEDULER_INVOCATION_USD: f64 = 1.00 / 1e6;
/// Step Functions Standard, per state transition.
const STEP_TRANSITION_USD: f64 = 25.0 / 1e6;

/// Lambda memory, as template.yaml sets it.
const LAMBDA_GB: f64 = 128.0 / 1024.0;
/// Assumed: one AWS request from a function takes this long in the same region.
const ASSUMED_REQUEST_MS: f64 = 10.0;
/// Assumed: a function's own work per invocation at 128 MB (JSON, hashing, the model stub).
const ASSUMED_CPU_MS: f64 = 5.0;
/// Assumed: the fewest transitions of a callback workflow per approval (start, wait for the
/// task token, execute, succeed).
const STEP_TRANSITIONS: f64 = 4.0;

#[derive(Debug, Clone, Serialize)]
pub struct CostLine {
    pub component: &'static str,
    pub per_approval: String,
    pub usd_per_million: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CostTable {
    pub lines: Vec<CostLine>,
    pub total_usd_per_million: f64,
    pub step_functions_usd_per_million: f64,
    pub assumptions: Vec<String>,
}

/// Requests that succeeded: attempts that failed and were retried are moto's (it is not safe
/// under concurrency and answers some requests with a 500), not DynamoDB's.
pub fn requests_of(step: &StepCost, service: &str) -> f64 {
    step.aws
        .iter()
        .filter(|(op, _)| op.starts_with(service))
        .map(|(_, c)| c.requests - c.errors)
        .sum()
}

/// One approval: the start that paused for it, the decision, and the resume that ran it.
pub fn per_million(start: &StepCost, decision: &StepCost, resume: &StepCost) -> CostTable {
    let steps = [start, decision, resume];
    let rru: f64 = steps.iter().map(|s| s.aws_total.estimated_rru).sum();
    let wru: f64 = steps
        .iter()
        .map(|s| s.aws_total.estimated_wru + s.aws_total.estimated_index_wru)
        .sum();
    let sqs: f64 = steps.iter().map(|s| requests_of(s, "SQS.")).sum();
    let scheduler_calls: f64 = steps.iter().map(|s| requests_of(s, "Scheduler.")).sum();
    let invocations = steps.len() as f64;
    let duration_ms: f64 = steps
        .iter()
        .map(|s| (s.aws_total.requests - s.aws_total.errors) * ASSUMED_REQUEST_MS + ASSUMED_CPU_MS)
        .sum();
    let million = 1e6;
    let duration_usd = duration_ms / 1000.0 * LAMBDA_GB * LAMBDA_ARM_GB_SECOND_USD;
    let lines = [
        (
            "DynamoDB reads (on-demand)",
            format!("{rru:.1} RRU"),
            rru * RRU_USD,
        ),
        (
            "DynamoDB writes (on-demand)",
            format!("{wru:.1} WRU"),
            wru * WRU_USD,
        ),
        ("SQS FIFO", format!("{sqs:.2} requests"), sqs * SQS_FIFO_USD),
        (
            "Lambda requests (arm64)",
            format!("{invocations:.0} invocations"),
            invocations * LAMBDA_REQUEST_USD,
        ),
        (
            "Lambda duration (arm64, 128 MB)",
            format!("{duration_ms:.0} ms (assumed)"),
            duration_usd,
        ),
        (
            "EventBridge Scheduler",
            format!("{scheduler_calls:.0} API calls, 0 invocations"),
            0.0,
        ),
    ]
    .map(|(component, per_approval, usd)| CostLine {
        component,
        per_approval,
        usd_per_million: usd * million,
    })
    .to_vec();
    let total = lines.iter().map(|l| l.usd_per_million).sum();
    CostTable {
        lines,
        total_usd_per_million: total,
        step_functions_usd_per_million: STEP_TRANSITIONS * STEP_TRANSITION_USD * million,
        assumptions: vec![
            "us-east-1 on-demand prices read 2026-11-29, free tiers left out: DynamoDB $0.625/M WRU and $0.125/M RRU, SQS FIFO $0.50/M requests, Lambda $0.20/M requests and $0.0000133334/GB-s on arm64, EventBridge Scheduler $1.00/M invocations, Step Functions Standard $25/M state transitions".into(),
            "request units are estimated from the items' sizes by DynamoDB's rules (transactional writes 2 WRU per KB per item, a one-write transaction sent as a plain conditional PutItem or DeleteItem 1 WRU per KB, the sparse index 1 WRU per KB per item entering, changing or leaving it, consistent reads 1 RRU per 4 KB, index queries half); moto's own ConsumedCapacity figures are placeholders".into(),
            format!("one invocation each of start, decide and resume per approval (an SQS batch of one, the worst case); each lasts {ASSUMED_REQUEST_MS} ms per AWS request it makes plus {ASSUMED_CPU_MS} ms of its own, at {} MB", LAMBDA_GB * 1024.0),
            "SQS requests as measured: one send, the bench consumer's share of a 10-message receive, one delete; an idle event source mapping's empty receives are a fixed monthly cost, left out".into(),
            "requests moto failed with a 500 and the SDK retried are left out of the cost (the errors column)".into(),
            "a decided approval's deadline schedule is deleted before it fires, so Scheduler bills nothing for it; one that expires fires once ($1.00/M) and invokes the sweep".into(),
            format!("Step Functions: {STEP_TRANSITIONS} transitions per approval (start, wait for the task token, execute, succeed), the orchestration alone: the model calls, the functions and the audit store it would still need are not in that figure"),
            "not included in either: API Gateway's HTTP API for the decision request, the reviewer's read of the approval before deciding (its own line, review read: one GetItem), CloudWatch Logs, storage ($0.25/GB-month) and point-in-time recovery".into(),
        ],
    }
}

/// The price of the expired approval's one scheduled invocation, per million.
pub fn scheduler_usd_per_million_expired() -> f64 {
    SCHEDULER_INVOCATION_USD * 1e6
}

pub fn table(cost: &CostTable) -> String {
    let mut text = format!(
        "  {:<34} {:>30} {:>14}\n",
        "cost per million approvals", "per approval", "USD"
    );
    for line in &cost.lines {
        text.push_str(&format!(
            "  {:<34} {:>30} {:>14.2}\n",
            line.component, line.per_approval, line.usd_per_million
        ));
    }
    text.push_str(&format!(
        "  {:<34} {:>30} {:>14.2}\n",
        "Countersign total", "", cost.total_usd_per_million
    ));
    text.push_str(&format!(
        "  {:<34} {:>30} {:>14.2}\n",
        "Step Functions callback", "4 state transitions", cost.step_functions_usd_per_million
    ));
    text.push_str(&format!(
        "  (an approval that expires instead adds one scheduled invocation: ${:.2} per million)\n",
        scheduler_usd_per_million_expired()
    ));
    text.push_str("  assumptions:\n");
    for assumption in &cost.assumptions {
        text.push_str(&format!("  - {assumption}\n"));
    }
    text
}
