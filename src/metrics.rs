//! `GET /metrics` on `countersign serve`: the engine's figures in the Prometheus text format
//! (0.0.4), rendered by `prometheus-client`, each series labelled by tenant and agent. Every
//! scrape reads the store, so what another process decided shows at once and a restart loses
//! nothing.
//!
//! Who may read it: with `COUNTERSIGN_METRICS_TOKEN` set, a request bearing that token
//! (`Authorization: Bearer …`); without it, any request, but only while `serve` listens on a
//! loopback address. The figures name tenants and agents, so a server open to a network keeps
//! them to whoever holds the token.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::prometheus_text::{self, CONTENT_TYPE};
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use shared::engine::{AgentFigures, Engine, Figures};

use crate::fail::Failure;

/// The variable that holds the token a scrape must bear.
pub const TOKEN_ENV: &str = "COUNTERSIGN_METRICS_TOKEN";

/// The shortest token taken: a guessable one would open the figures to anyone who tries.
const MIN_TOKEN: usize = 16;

/// Who may read `/metrics`.
#[derive(Clone)]
enum Access {
    /// Whoever bears this token (its SHA-256, compared whole).
    Token([u8; 32]),
    /// Anyone who reaches the server: it listens on loopback only.
    Loopback,
    /// Nobody: the server listens beyond loopback and no token is set.
    Closed,
}

#[derive(Clone)]
struct Scrape {
    engine: Arc<Engine>,
    access: Access,
}

/// The `/metrics` route of a server listening on `bound`, with the token the environment sets.
pub fn router(engine: Arc<Engine>, bound: SocketAddr) -> Result<Router, Failure> {
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let access = match token {
        Some(token) if token.trim().len() < MIN_TOKEN => {
            return Err(Failure::usage(format!(
                "{TOKEN_ENV} must be at least {MIN_TOKEN} characters"
            )));
        }
        Some(token) => Access::Token(Sha256::digest(token.trim().as_bytes()).into()),
        None if bound.ip().is_loopback() => Access::Loopback,
        None => {
            eprintln!(
                "NOTE: GET /metrics answers 403 on {bound}, a non-loopback address: set \
                 {TOKEN_ENV} for scrapers to bear"
            );
            Access::Closed
        }
    };
    Ok(Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape { engine, access }))
}

async fn scrape(State(scrape): State<Scrape>, headers: HeaderMap) -> Response {
    if let Some(refused) = refused(&scrape.access, &headers) {
        return refused;
    }
    match scrape.engine.figures(None).await {
        Ok(figures) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], render(figures)).into_response(),
        Err(error) => {
            tracing::warn!(%error, "the figures could not be read");
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &format!("the figures could not be read: {error}"),
            )
        }
    }
}

/// Why this request may not read the figures, as its answer; `None` when it may.
fn refused(access: &Access, headers: &HeaderMap) -> Option<Response> {
    match access {
        Access::Loopback => None,
        Access::Closed => Some(error_response(
            StatusCode::FORBIDDEN,
            "metrics_need_token",
            &format!("this server listens beyond loopback: set {TOKEN_ENV} and bear it"),
        )),
        Access::Token(expected) => {
            let borne = headers
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "))
                .map(|token| <[u8; 32]>::from(Sha256::digest(token.trim().as_bytes())));
            match borne {
                Some(borne) if borne == *expected => None,
                _ => Some(error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    &format!("GET /metrics needs the bearer token {TOKEN_ENV} holds"),
                )),
            }
        }
    }
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "code": code, "message": message });
    (status, axum::Json(body)).into_response()
}

/// The figures in the Prometheus text format.
pub fn render(figures: Figures) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scraped(figures)));
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry).expect("a String takes any text");
    text
}

/// One scrape's figures, encoded as the metrics the operations page names.
#[derive(Debug)]
struct Scraped(Figures);

type Labels<'a> = Vec<(&'static str, &'a str)>;

fn labels(agent: &AgentFigures) -> Labels<'_> {
    vec![
        ("tenant", agent.tenant.as_str()),
        ("agent", agent.agent.as_str()),
    ]
}

/// One metric: its family's descriptor, then one series per agent with `series`' labels.
fn family<'a>(
    encoder: &mut DescriptorEncoder,
    figures: &'a Figures,
    (name, help, kind): (&str, &str, MetricType),
    each: impl Fn(&'a AgentFigures) -> Vec<(Labels<'a>, Value)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for agent in &figures.agents {
        for (labels, value) in each(agent) {
            let mut metric = family.encode_family(&labels)?;
            match value {
                Value::Gauge(v) => metric.encode_gauge(&v)?,
                Value::Counter(n) => metric.encode_counter::<NoLabelSet, _, u64>(&n, None)?,
                Value::Histogram(sum, count, ref buckets) => {
                    metric.encode_histogram::<NoLabelSet>(sum, count, buckets, None)?
                }
            }
        }
    }
    Ok(())
}

/// One counter series per value of `agent`'s label `label` (an outcome, a kind of token).
fn by_label<'a>(
    agent: &'a AgentFigures,
    label: &'static str,
    counts: impl Iterator<Item = (&'static str, u64)>,
) -> Vec<(Labels<'a>, Value)> {
    counts
        .map(|(value, n)| {
            let mut l = labels(agent);
            l.push((label, value));
            (l, Value::Counter(n))
        })
        .collect()
}

enum Value {
    Gauge(f64),
    Counter(u64),
    /// Sum, count, and each bucket's own count (not cumulative), the last one's bound +Inf.
    Histogram(f64, u64, Vec<(f64, u64)>),
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = &self.0;
        family(
            &mut encoder,
            figures,
            (
                "countersign_approvals_waiting",
                "Approvals of calls waiting on people.",
                MetricType::Gauge,
            ),
            |a| vec![(labels(a), Value::Gauge(a.approvals_waiting as f64))],
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_approval_oldest_wait_seconds",
                "How long the oldest approval waiting on people has waited; 0 when none waits.",
                MetricType::Gauge,
            ),
            |a| vec![(labels(a), Value::Gauge(a.oldest_wait_seconds))],
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_unknown_outcomes",
                "Calls whose outcome is unknown, waiting for a reconcile or a recovery owner.",
                MetricType::Gauge,
            ),
            |a| vec![(labels(a), Value::Gauge(a.unknown_outcomes as f64))],
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_decisions",
                "Approvals decided by people, or expired.",
                MetricType::Counter,
            ),
            |a| {
                by_label(
                    a,
                    "outcome",
                    a.decisions.iter().map(|(o, n)| (o.as_str(), *n)),
                )
            },
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_decision_seconds",
                "Time from an approval's creation to its decision or expiry.",
                MetricType::Histogram,
            ),
            |a| {
                let times = &a.decision_seconds;
                let mut buckets = times.buckets.clone();
                buckets.push((f64::INFINITY, times.beyond));
                vec![(labels(a), Value::Histogram(times.sum, times.count, buckets))]
            },
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_executions",
                "Calls that ran, by the outcome first recorded.",
                MetricType::Counter,
            ),
            |a| {
                by_label(
                    a,
                    "outcome",
                    a.executions.iter().map(|(o, n)| (o.as_str(), *n)),
                )
            },
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_policy_outcomes",
                "Policy's rulings on proposed calls, enforced or what log-only rules would have made.",
                MetricType::Counter,
            ),
            |a| {
                a.policy_outcomes
                    .iter()
                    .map(|ruled| {
                        let mut l = labels(a);
                        l.push(("outcome", ruled.outcome.name()));
                        l.push(("mode", ruled.mode.as_str()));
                        (l, Value::Counter(ruled.count))
                    })
                    .collect()
            },
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_model_requests",
                "Model requests of driven runs: ok, or error once the model API's retries gave up.",
                MetricType::Counter,
            ),
            |a| {
                let requests = a.model_requests.iter();
                by_label(a, "outcome", requests.map(|(o, n)| (o.as_str(), *n)))
            },
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_model_tokens",
                "Tokens model turns read (input) and wrote (output), as the model API reported them.",
                MetricType::Counter,
            ),
            |a| {
                by_label(
                    a,
                    "kind",
                    a.model_tokens.iter().map(|(k, n)| (k.as_str(), *n)),
                )
            },
        )?;
        family(
            &mut encoder,
            figures,
            (
                "countersign_resume_failures",
                "Queued resume or drive messages whose handling failed, to be delivered again.",
                MetricType::Counter,
            ),
            |a| vec![(labels(a), Value::Counter(a.resume_failures))],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearing(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!("Bearer {token}").parse().unwrap();
        headers.insert(header::AUTHORIZATION, value);
        headers
    }

    #[test]
    fn a_server_beyond_loopback_without_a_token_refuses_every_scrape_and_one_with_a_token_only_other_tokens()
     {
        let closed = refused(&Access::Closed, &bearing("anything-at-all-here"));
        assert_eq!(closed.map(|r| r.status()), Some(StatusCode::FORBIDDEN));

        let token = Access::Token(Sha256::digest(b"the-right-token-here").into());
        assert!(refused(&token, &bearing("the-right-token-here")).is_none());
        for headers in [bearing("the-wrong-token-here"), HeaderMap::new()] {
            let status = refused(&token, &headers).map(|r| r.status());
            assert_eq!(status, Some(StatusCode::UNAUTHORIZED));
        }
        assert!(refused(&Access::Loopback, &HeaderMap::new()).is_none());
    }
}
