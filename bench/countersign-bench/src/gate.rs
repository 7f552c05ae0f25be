//! `--gate`: the gate API over loopback HTTP, on the embedded store. One call the policy
//! allows ($50 of an expense claim), proposed through `POST /gate/calls` and run by Countersign,
//! against the same call made by a run of the expense agent through `POST /runs` (a scripted
//! model proposes it and reports its outcome): latency and calls per second at concurrency 1
//! and 8. Then how soon a caller long-polling a waiting call hears of its outcome once a person
//! approves it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use shared::api::{self, Background, BearerJwt};
use shared::domain::approval::{Choice, DecisionRequest};
use shared::domain::identity::Identity;
use shared::domain::ids::{ActionVersion, ApprovalId, DecisionId, PersonId, Role};
use shared::testing::SMALL_CENTS;
use tokio::net::TcpListener;

use crate::report::{self, Latency};
use crate::rig::Rig;
use crate::script::claim_id;
use crate::{BenchArgs, BenchError, BenchStore, Output};

/// The concurrencies each path is driven at.
const CONCURRENCIES: [usize; 2] = [1, 8];
/// How long a waiting caller's long-poll may hold.
const WAIT: &str = "25s";

/// One path at one concurrency.
#[derive(Debug, Serialize)]
struct PathFigures {
    path: &'static str,
    concurrency: usize,
    calls: usize,
    calls_per_second: f64,
    latency: Latency,
}

/// A waiting caller, woken by a decision.
#[derive(Debug, Serialize)]
struct WakeFigures {
    waits: usize,
    /// From the decision's start to the waiting caller's answer (the decision runs the call).
    decision_to_answer: Latency,
    /// From the decision's return, when the outcome is recorded, to the waiting caller's answer;
    /// zero where the answer came first.
    outcome_to_answer: Latency,
}

/// The bench's own HTTP client, as an agent's process would hold one.
struct Caller {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Caller {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), BenchError> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| BenchError::Run(format!("{path}: {e}")))?;
        let status = answer.status().as_u16();
        let body = answer
            .json()
            .await
            .map_err(|e| BenchError::Run(format!("{path}: {e}")))?;
        Ok((status, body))
    }
}

pub async fn run(args: &BenchArgs) -> Result<Output, BenchError> {
    if args.store != BenchStore::Embedded {
        return Err(BenchError::Setup(
            "--gate runs on the embedded store only".into(),
        ));
    }
    let (runs, waits) = (args.runs, args.runs.min(200));
    let paths = 2 * CONCURRENCIES.len();
    let rig = Arc::new(Rig::new(BenchStore::Embedded, paths * runs + waits).await?);
    let load_before = report::load_average();
    let caller = Arc::new(serve(&rig).await?);

    let mut figures = Vec::new();
    let mut next_claim = 0;
    for concurrency in CONCURRENCIES {
        for path in ["gate", "runs"] {
            let claims = next_claim..next_claim + runs;
            next_claim += runs;
            figures.push(drive(&caller, path, claims, concurrency).await?);
        }
    }
    let wake = wake_ups(&rig, &caller, next_claim..next_claim + waits).await?;
    let load_after = report::load_average();

    let mut text = format!(
        "countersign-bench --gate: {runs} allowed calls per path and concurrency, embedded store, loopback HTTP\n\n"
    );
    for f in &figures {
        text += &format!(
            "  {:<20} concurrency {}   {:>7.0} calls/s   {}\n",
            match f.path {
                "gate" => "POST /gate/calls",
                _ => "POST /runs",
            },
            f.concurrency,
            f.calls_per_second,
            f.latency.line()
        );
    }
    text += &format!(
        "\n  a waiting caller, woken by a decision ({waits} waits)\n  decision to answer  {}\n  outcome to answer   {}\n",
        wake.decision_to_answer.line(),
        wake.outcome_to_answer.line()
    );
    text += &format!(
        "\n  load average before {:?}, after {:?}\n",
        load_before, load_after
    );
    let json = json!({
        "bench": "gate",
        "store": "embedded",
        "runs": runs,
        "paths": figures,
        "wake": wake,
        "load_average": {"before": load_before, "after": load_after},
    });
    Ok(Output { text, json })
}

/// The local server's routes over the rig's engine, on a loopback port of their own, and a
/// caller holding a token of the rig's tenant.
async fn serve(rig: &Rig) -> Result<Caller, BenchError> {
    let key: [u8; 32] = rand::random();
    let jwt = Arc::new(BearerJwt::hs256(&key).map_err(|e| BenchError::Setup(e.to_string()))?);
    let agent = Identity {
        tenant: rig.tenant.clone(),
        person: PersonId::parse("bench-agent").expect("a well-formed person"),
        roles: [Role::parse("employee").expect("a well-formed role")].into(),
        claims: Default::default(),
    };
    let token = jwt
        .issue(&agent, chrono::Utc::now(), Duration::from_secs(3600))
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let router = api::local_router(
        rig.engine.clone(),
        jwt,
        rig.claims.clone(),
        None,
        None,
        Background::default(),
        api::mcp::Settings::default(),
    );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| BenchError::Setup(format!("a loopback port: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(Caller {
        http: reqwest::Client::new(),
        base: format!("http://{addr}"),
        token,
    })
}

/// Pays each claim of `claims` $50 through `path`, `concurrency` at a time.
async fn drive(
    caller: &Arc<Caller>,
    path: &'static str,
    claims: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<PathFigures, BenchError> {
    let calls = claims.len();
    let next = Arc::new(AtomicUsize::new(claims.start));
    let began = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (caller, next, end) = (caller.clone(), next.clone(), claims.end);
        workers.spawn(async move {
            let mut samples = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= end {
                    return Ok::<_, BenchError>(samples);
                }
                let started = Instant::now();
                pay_small(&caller, path, n).await?;
                samples.push(started.elapsed());
            }
        });
    }
    let mut samples = Vec::with_capacity(calls);
    while let Some(worker) = workers.join_next().await {
        samples.extend(worker.map_err(|e| BenchError::Run(e.to_string()))??);
    }
    let elapsed = began.elapsed();
    Ok(PathFigures {
        path,
        concurrency,
        calls,
        calls_per_second: calls as f64 / elapsed.as_secs_f64(),
        latency: Latency::of(&samples).expect("at least one call"),
    })
}

/// One allowed payment of claim `n`, checked: the call ran and paid.
async fn pay_small(caller: &Caller, path: &str, n: usize) -> Result<(), BenchError> {
    let claim = claim_id(n);
    let (status, body) = match path {
        "gate" => {
            let call = json!({
                "agent": "expense",
                "tool": "reimburse",
                "args": {"claim_id": claim, "amount_cents": SMALL_CENTS, "note": "A small claim."},
                "call_id": format!("bench-{claim}"),
            });
            caller
                .send(reqwest::Method::POST, "/gate/calls", Some(call))
                .await?
        }
        _ => {
            let run = json!({"agent": "expense", "task": format!("Pay the small claim {claim}.")});
            let (mut status, mut body) = caller
                .send(reqwest::Method::POST, "/runs", Some(run))
                .await?;
            // Accepted (202) and driven by the server after its answer: read until it ran.
            let read = format!("/runs/{}", body["run_id"].as_str().unwrap_or_default());
            while status == 202 || (status == 200 && body["status"] == "running") {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                (status, body) = caller.send(reqwest::Method::GET, &read, None).await?;
            }
            (status, body)
        }
    };
    let done = match path {
        "gate" => status == 200 && body["status"] == "succeeded",
        _ => status == 200 && body["status"] == "done",
    };
    if !done {
        return Err(BenchError::Run(format!(
            "{path} {claim}: {status} {body}, not paid at once"
        )));
    }
    Ok(())
}

/// For each claim: a $250 call waits on a person; a caller long-polls it; a finance approver
/// approves it in the engine; the caller's answer is timed.
async fn wake_ups(
    rig: &Arc<Rig>,
    caller: &Arc<Caller>,
    claims: std::ops::Range<usize>,
) -> Result<WakeFigures, BenchError> {
    let waits = claims.len();
    let (mut from_decision, mut from_outcome) = (Vec::new(), Vec::new());
    for n in claims {
        let claim = claim_id(n);
        let call = json!({
            "agent": "expense",
            "tool": "reimburse",
            "args": {"claim_id": claim, "amount_cents": crate::script::PROPOSED_CENTS, "note": "Lodging is capped at $250 a night."},
            "call_id": format!("bench-wait-{claim}"),
        });
        let (status, body) = caller
            .send(reqwest::Method::POST, "/gate/calls", Some(call))
            .await?;
        let (Some(id), Some(approval)) = (body["id"].as_str(), body["approval"]["id"].as_str())
        else {
            return Err(BenchError::Run(format!(
                "{claim}: {status} {body}, not waiting on a person"
            )));
        };
        let approval = ApprovalId::parse(approval).map_err(|e| BenchError::Run(e.to_string()))?;
        let waiter = {
            let (caller, path) = (caller.clone(), format!("/gate/calls/{id}?wait={WAIT}"));
            tokio::spawn(async move {
                let answer = caller.send(reqwest::Method::GET, &path, None).await;
                (answer, Instant::now())
            })
        };
        // The long-poll is parked before the decision comes.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let decided = Instant::now();
        let request = DecisionRequest {
            decision_id: DecisionId::parse(&format!("bench-wait-{n}")).expect("a decision id"),
            action_version: ActionVersion::FIRST,
            choice: Choice::Approve,
        };
        rig.engine
            .decide(&rig.approver, &approval, request)
            .await
            .map_err(|e| BenchError::Run(format!("approve {claim}: {e}")))?;
        let recorded = Instant::now();
        let (answer, answered) = waiter.await.map_err(|e| BenchError::Run(e.to_string()))?;
        let (_, body) = answer?;
        if body["status"] != "succeeded" {
            return Err(BenchError::Run(format!(
                "{claim}: the waiting caller heard {body}"
            )));
        }
        from_decision.push(answered - decided);
        from_outcome.push(answered.saturating_duration_since(recorded));
    }
    Ok(WakeFigures {
        waits,
        decision_to_answer: Latency::of(&from_decision).expect("at least one wait"),
        outcome_to_answer: Latency::of(&from_outcome).expect("at least one wait"),
    })
}
