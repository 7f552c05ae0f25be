//! `countersign serve` as a real process on a free port, with tokens from `countersign token`
//! and plain HTTP: the harness of the HTTP API's tests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use shared::api::BearerJwt;
use shared::domain::identity::Identity;

use super::{countersign, fresh_path, stdout_of};

/// One `countersign serve` over a fresh state directory; killed and removed when dropped.
pub struct Server {
    child: Child,
    pub base: String,
    pub state: PathBuf,
    pub http: reqwest::Client,
    tokens: Mutex<HashMap<String, String>>,
}

pub struct Reply {
    pub status: u16,
    pub json: Value,
    pub www_authenticate: Option<String>,
}

impl Server {
    /// A server that does not sweep, so what a test sees is only what it did.
    pub fn start(name: &str) -> Self {
        Self::start_sweeping(name, "0s")
    }

    /// A server that does not sweep and offers development sign-in.
    /// [`Server::start`], with `requester`'s run of `claim` paused on its approval.
    pub async fn with_paused_run(name: &str, requester: &str, claim: &str) -> (Self, Paused) {
        let server = Self::start(name);
        let paused = server.paused_run(requester, claim, None).await;
        (server, paused)
    }

    pub fn start_dev(name: &str) -> Self {
        Self::start_with(name, &["--sweep-every", "0s", "--dev-sign-in"])
    }

    /// The state directory's development sign-in secret, as only its owner can read it.
    pub fn dev_secret(&self) -> String {
        self.offered_dev_secret()
            .expect("--dev-sign-in made the secret")
    }

    /// The development sign-in secret, if the server offers development sign-in.
    pub fn offered_dev_secret(&self) -> Option<String> {
        std::fs::read_to_string(self.state.join("dev-sign-in.secret")).ok()
    }

    /// The port the server listens on, for requests written by hand.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    pub fn start_sweeping(name: &str, every: &str) -> Self {
        Self::start_with(name, &["--sweep-every", every])
    }

    /// A server started with `countersign serve --addr 127.0.0.1:0` and `args`.
    pub fn start_with(name: &str, args: &[&str]) -> Self {
        Self::start_with_env(name, args, &[])
    }

    /// As [`Server::start_with`], the server also getting the variables `env` (an agent's
    /// endpoint and token, say).
    pub fn start_with_env(name: &str, args: &[&str], env: &[(&str, String)]) -> Self {
        let state = fresh_path(&format!("countersign-api-{name}"));
        let (child, base) = serve(&state, args, env);
        Self {
            child,
            base,
            state,
            // The server closes a keep-alive connection idle for its header timeout (10 s); a
            // client that kept one longer could send on it as it closes (IncompleteMessage), so
            // the pool lets its connections go well before that.
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(3))
                .build()
                .unwrap(),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Kills the server at once, as a crash would, and starts another over the same state
    /// with `args` and `env`: the tokens made so far still hold.
    pub fn crash_and_restart(&mut self, args: &[&str], env: &[(&str, String)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        (self.child, self.base) = serve(&self.state, args, env);
    }

    /// A token from `countersign token --as NAME`, made once per person.
    pub fn token(&self, name: &str) -> String {
        let mut tokens = self.tokens.lock().unwrap();
        if let Some(token) = tokens.get(name) {
            return token.clone();
        }
        let output = self.countersign_stdout(&["token", "--as", name]);
        let token = String::from_utf8(output).unwrap().trim().to_string();
        tokens.insert(name.to_string(), token.clone());
        token
    }

    /// A token the server never issued, signed with its own key.
    pub fn forged_token(
        &self,
        who: Identity,
        issued_ago: chrono::Duration,
        ttl: Duration,
    ) -> String {
        let key = std::fs::read(self.state.join("dev-jwt.key")).expect("the dev key exists");
        BearerJwt::hs256(&key)
            .unwrap()
            .issue(&who, chrono::Utc::now() - issued_ago, ttl)
            .unwrap()
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<String>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Reply {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            request = request.header("content-type", content_type).body(bytes);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let www_authenticate = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_string());
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{status} with a body that is not JSON: {text:?}"));
        Reply {
            status,
            json,
            www_authenticate,
        }
    }

    pub async fn get(&self, path: &str, name: &str) -> Reply {
        let token = self.token(name);
        self.send(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    pub async fn post(&self, path: &str, name: &str, body: Value) -> Reply {
        self.post_raw(path, name, &body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, name: &str, body: &str) -> Reply {
        let token = self.token(name);
        self.send(
            reqwest::Method::POST,
            path,
            Some(token),
            Some(("application/json", body.as_bytes().to_vec())),
        )
        .await
    }

    /// `POST /runs` as `name`: `agent` started on `task`. Once it is accepted, the run as
    /// `GET /runs/{id}` gives it when it stopped running ([`Server::start_run`]).
    pub async fn start_agent(&self, name: &str, agent: &str, task: &str) -> Reply {
        self.start_run(name, json!({"agent": agent, "task": task}))
            .await
    }

    /// `POST /runs` as `name` with `body`: a refusal as it is; a run accepted (202, running,
    /// with its links) is read as `name` until it stops running (paused, done or failed), and
    /// that read (200) comes back.
    pub async fn start_run(&self, name: &str, body: Value) -> Reply {
        let accepted = self.post("/runs", name, body).await;
        if accepted.status != 202 {
            return accepted;
        }
        assert_eq!(accepted.json["status"], "running", "{}", accepted.json);
        let run = accepted.json["run_id"].as_str().unwrap();
        assert_eq!(
            accepted.json["links"]["self"],
            format!("/runs/{run}"),
            "{}",
            accepted.json
        );
        self.settled(name, run).await
    }

    /// `GET /runs/{run}` as `name`, again until the run no longer runs (at most 30 s).
    pub async fn settled(&self, name: &str, run: &str) -> Reply {
        self.settled_within(name, run, Duration::from_secs(30))
            .await
    }

    /// [`Server::settled`], waiting at most `within`.
    pub async fn settled_within(&self, name: &str, run: &str, within: Duration) -> Reply {
        let deadline = std::time::Instant::now() + within;
        loop {
            let reply = self.get(&format!("/runs/{run}"), name).await;
            assert_eq!(reply.status, 200, "{}", reply.json);
            if reply.json["status"] != "running" {
                return reply;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still running after {within:?}: {}",
                reply.json
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `POST /runs` as `name`; the run must pause on exactly one approval.
    pub async fn paused_run(&self, name: &str, claim: &str, ttl: Option<&str>) -> Paused {
        let mut body = json!({"claim_id": claim});
        if let Some(ttl) = ttl {
            body["ttl"] = json!(ttl);
        }
        let reply = self.start_run(name, body).await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        assert_eq!(reply.json["status"], "awaiting_approval", "{}", reply.json);
        let approvals = reply.json["approvals"].as_array().unwrap();
        assert_eq!(approvals.len(), 1, "{}", reply.json);
        Paused {
            run: reply.json["run_id"].as_str().unwrap().to_string(),
            approval: approvals[0]["id"].as_str().unwrap().to_string(),
        }
    }

    /// The approval as a finance reviewer of acme reads it.
    pub async fn approval(&self, id: &str) -> Value {
        let reply = self.get(&format!("/approvals/{id}"), "dana").await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        reply.json
    }

    pub async fn decide(&self, name: &str, approval: &str, body: Value) -> Reply {
        self.post(&format!("/approvals/{approval}/decisions"), name, body)
            .await
    }

    /// `name`'s decision `body`, which must be taken (200): the reply.
    pub async fn decided(&self, name: &str, approval: &str, body: Value) -> Reply {
        let reply = self.decide(name, approval, body).await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        reply
    }

    /// dana approves `approval` with the decision id `dana-1`, and it is taken: the reply.
    pub async fn dana_approves(&self, approval: &str) -> Reply {
        self.decided("dana", approval, approve("dana-1")).await
    }

    /// A run's audit log as a finance reviewer of acme reads it.
    pub async fn audit(&self, run: &str) -> Value {
        let reply = self.get(&format!("/runs/{run}/audit"), "dana").await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        reply.json
    }

    /// The audit log's entries that `keep` selects, oldest first.
    async fn entries(&self, run: &str, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
        let audit = self.audit(run).await;
        let entries = audit["entries"].as_array().unwrap();
        entries.iter().filter(|e| keep(e)).cloned().collect()
    }

    /// The audit log's events about one action (every version), oldest first.
    pub async fn events_of_action(&self, run: &str, action: &Value) -> Vec<String> {
        let entries = self.entries(run, |e| e["action_id"] == *action).await;
        entries
            .iter()
            .map(|e| e["event"].as_str().unwrap().to_string())
            .collect()
    }

    /// The decisions recorded in a run's audit log, oldest first.
    pub async fn decisions(&self, run: &str) -> Vec<Value> {
        self.entries(run, |e| e["event"] == "decision").await
    }

    /// Sends the server SIGTERM, as a service manager stops it.
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM: {status}");
    }

    /// Returns once nothing listens at the server's address any more; the test fails if that
    /// takes longer than `within`.
    pub async fn until_not_listening(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::net::TcpStream::connect(self.addr()).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "still listening after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server's exit status, once it exited; the test fails if that takes longer than
    /// `within`.
    pub async fn exited(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("the server's status") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `countersign audit RUN` over the server's state, without the server: the run's history.
    pub fn history(&self, run: &str) -> Value {
        serde_json::from_slice(&self.countersign_stdout(&["--json", "audit", run])).unwrap()
    }

    /// `countersign ARGS` over the server's state: what it printed, once it succeeded.
    fn countersign_stdout(&self, args: &[&str]) -> Vec<u8> {
        stdout_of(
            countersign(&self.state).args(args),
            &format!("countersign {args:?}"),
        )
    }

    /// `countersign ledger --json` over the server's state: claim and cents of every payment.
    pub fn payments(&self) -> Vec<(String, i64)> {
        let ledger: Value =
            serde_json::from_slice(&self.countersign_stdout(&["--json", "ledger"])).unwrap();
        ledger["payments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["claim_id"].as_str().unwrap().to_string(),
                    p["amount"].as_i64().unwrap(),
                )
            })
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

pub struct Paused {
    pub run: String,
    pub approval: String,
}

/// `countersign serve --addr 127.0.0.1:0 ARGS` over `state`, with `env`: the process and the
/// address it listens on.
fn serve(state: &std::path::Path, args: &[&str], env: &[(&str, String)]) -> (Child, String) {
    let mut child = countersign(state)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("countersign serve starts");
    let base = super::listening_url(&mut child, "countersign serve", Duration::from_secs(60));
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    (child, base)
}

/// A server with one run paused on one approval, and that approval as it was then: a refused
/// request must leave it so.
pub struct Pending {
    pub server: Server,
    pub run: String,
    pub approval: String,
    before: Value,
}

/// A pending claim's server answers its requests: `c102.get(…)`, `c102.decide(…)`.
impl std::ops::Deref for Pending {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.server
    }
}

impl Pending {
    /// ben's c-102 ($250 of lodging) waiting on a finance reviewer.
    pub async fn c102(name: &str) -> Self {
        let (server, Paused { run, approval }) =
            Server::with_paused_run(name, "ben", "c-102").await;
        let before = server.approval(&approval).await;
        Self {
            server,
            run,
            approval,
            before,
        }
    }

    /// Asserts the approval is as it was when the run paused.
    pub async fn unchanged(&self) {
        assert_eq!(self.server.approval(&self.approval).await, self.before);
    }

    /// `name`'s decision `body` is refused with `status` and `code`, and changes nothing.
    pub async fn refuses(&self, name: &str, body: Value, status: u16, code: &str) {
        let reply = self.server.decide(name, &self.approval, body).await;
        self.refused(&reply, status, code).await;
    }

    /// `reply` is a refusal with `status` and `code`, and the approval is as it was.
    pub async fn refused(&self, reply: &Reply, status: u16, code: &str) {
        assert_refused(reply, status, code);
        self.unchanged().await;
    }

    /// A decision to approve sent as written: with this bearer token, if any, and content type.
    pub async fn send_approval(&self, bearer: Option<String>, content_type: &str) -> Reply {
        let path = format!("/approvals/{}/decisions", self.approval);
        let bytes = approve("d1").to_string().into_bytes();
        self.server
            .send(
                reqwest::Method::POST,
                &path,
                bearer,
                Some((content_type, bytes)),
            )
            .await
    }
}

pub fn approve(decision_id: &str) -> Value {
    json!({"decision_id": decision_id, "action_version": 1, "choice": "approve"})
}

#[track_caller]
pub fn assert_refused(reply: &Reply, status: u16, code: &str) {
    assert_refused_naming(reply, status, code, "");
}

/// [`assert_refused`], and the message names `mention`.
#[track_caller]
pub fn assert_refused_naming(reply: &Reply, status: u16, code: &str, mention: &str) {
    assert_eq!(reply.status, status, "{}", reply.json);
    assert_eq!(reply.json["error"]["code"], code, "{}", reply.json);
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.is_empty() && message.contains(mention),
        "{}",
        reply.json
    );
}
