//! For the notification scenarios: a webhook receiver on loopback that records what it is sent
//! and answers as told, a store connection that holds index reads until several processes have
//! read, and a scheduler that records its wake-ups.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use async_trait::async_trait;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use chrono::{DateTime, Utc};
use serde_json::Value;
use shared::adapters::webhook::Webhooks;
use shared::domain::ids::{ApprovalId, TenantId};
use shared::ports::scheduler::{Scheduler, SchedulerError, Wake};
use shared::ports::store::{Item, ItemStore, Page, Query, Range, StoreError, Write};

/// How the receiver answers one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Status(u16),
    /// Never answers: the connection stays open until the sender gives up.
    Hang,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Value,
}

impl Received {
    pub fn idempotency_key(&self) -> &str {
        self.headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .expect("an Idempotency-Key header")
    }

    /// `approval_requested` or `reminder`.
    pub fn notice(&self) -> &str {
        self.body["countersign"]["notice"]
            .as_str()
            .expect("a notice kind")
    }

    pub fn approval_id(&self) -> &str {
        self.body["countersign"]["approval_id"]
            .as_str()
            .expect("an approval id")
    }
}

struct Script {
    seen: Mutex<Vec<Received>>,
    first: Mutex<VecDeque<Answer>>,
    then: Answer,
}

/// A webhook receiver on loopback: answers from a script, then always the same way.
#[derive(Clone)]
pub struct Receiver {
    url: String,
    script: Arc<Script>,
}

async fn receive(
    State(script): State<Arc<Script>>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> StatusCode {
    script.seen.lock().unwrap().push(Received {
        headers,
        body: body.0,
    });
    let answer = script
        .first
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(script.then);
    match answer {
        Answer::Status(status) => StatusCode::from_u16(status).unwrap(),
        Answer::Hang => std::future::pending().await,
    }
}

impl Receiver {
    /// Answers each request with the next of `first`, then always with `then`.
    pub async fn scripted(first: &[Answer], then: Answer) -> Self {
        let script = Arc::new(Script {
            seen: Mutex::new(Vec::new()),
            first: Mutex::new(first.iter().copied().collect()),
            then,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state(script.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url: format!("http://{addr}/hook"),
            script,
        }
    }

    /// Answers 200 to everything.
    pub async fn ok() -> Self {
        Self::scripted(&[], Answer::Status(200)).await
    }

    /// Fails the first `n` requests with a 503, then answers 200.
    pub async fn failing_first(n: usize) -> Self {
        Self::scripted(&vec![Answer::Status(503); n], Answer::Status(200)).await
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// `127.0.0.1:<port>`: how the audit log names this receiver.
    pub fn host(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/hook")
            .to_string()
    }

    pub fn requests(&self) -> Vec<Received> {
        self.script.seen.lock().unwrap().clone()
    }

    /// The kind of each notice received, in order.
    pub fn notices(&self) -> Vec<String> {
        let requests = self.requests();
        requests.iter().map(|r| r.notice().to_string()).collect()
    }

    /// Returns once `n` requests arrived in all.
    pub async fn until_requests(&self, n: usize) {
        while self.script.seen.lock().unwrap().len() < n {
            tokio::time::sleep(StdDuration::from_millis(5)).await;
        }
    }

    /// A webhook notifier posting here, each post bounded by `timeout`.
    pub fn webhooks(&self, timeout: StdDuration) -> Arc<Webhooks> {
        Arc::new(Webhooks::new(std::slice::from_ref(&self.url), timeout).expect("a loopback URL"))
    }
}

/// A store connection whose reads of one index (each of its shards) wait until `together` has as many
/// readers as it was made for: sweeps that all read the same items before any of them writes.
pub struct ReadsTogether {
    inner: Arc<dyn ItemStore>,
    index: String,
    together: Arc<tokio::sync::Barrier>,
}

impl ReadsTogether {
    pub fn wrap(
        inner: Arc<dyn ItemStore>,
        index: &str,
        together: Arc<tokio::sync::Barrier>,
    ) -> Arc<dyn ItemStore> {
        Arc::new(Self {
            inner,
            index: index.to_string(),
            together,
        })
    }
}

#[async_trait]
impl ItemStore for ReadsTogether {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        self.inner.get(pk, sk).await
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        let page = self.inner.page(query).await?;
        // A sharded index is read a shard at a time: every sweep waits at each shard.
        if let Range::Index { pk, .. } = query.range
            && pk
                .strip_prefix(self.index.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('#'))
        {
            self.together.wait().await;
        }
        Ok(page)
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.inner.transact(writes).await
    }
}

/// One call to the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduled {
    Schedule(ApprovalId, Wake, DateTime<Utc>),
    Unschedule(ApprovalId, Wake),
}

/// A scheduler that records its calls.
#[derive(Default)]
pub struct RecordingScheduler {
    calls: Mutex<Vec<Scheduled>>,
}

impl RecordingScheduler {
    pub fn calls(&self) -> Vec<Scheduled> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl Scheduler for RecordingScheduler {
    async fn schedule(
        &self,
        _: &TenantId,
        approval: &ApprovalId,
        wake: Wake,
        at: DateTime<Utc>,
    ) -> Result<(), SchedulerError> {
        let call = Scheduled::Schedule(approval.clone(), wake, at);
        self.calls.lock().unwrap().push(call);
        Ok(())
    }

    async fn unschedule(
        &self,
        _: &TenantId,
        approval: &ApprovalId,
        wake: Wake,
    ) -> Result<(), SchedulerError> {
        let call = Scheduled::Unschedule(approval.clone(), wake);
        self.calls.lock().unwrap().push(call);
        Ok(())
    }
}
