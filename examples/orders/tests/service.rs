//! The orders service as a real process on a free port, driven over HTTP.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

/// `orders serve` in a fresh directory; killed and cleaned up when dropped.
struct Orders {
    child: Child,
    // Held open so the server's stdout never becomes a broken pipe.
    _stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    base: String,
    token: Option<&'static str>,
    http: reqwest::Client,
}

impl Orders {
    fn start(name: &str) -> Self {
        Self::start_with(name, &[], None)
    }

    fn start_with(name: &str, args: &[&str], token: Option<&'static str>) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("orders-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_orders"));
        command
            .args(["serve", "--addr", "127.0.0.1:0", "--db"])
            .arg(dir.join("orders.db"))
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("ORDERS_TOKEN")
            .stdout(Stdio::piped());
        if let Some(token) = token {
            command.env("ORDERS_TOKEN", token);
        }
        let mut child = command.spawn().expect("orders starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Self {
            child,
            _stdout: stdout,
            dir,
            base,
            token,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().await.expect("the service answers");
        let status = response.status();
        let body = response.json().await.expect("a JSON body");
        (status, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        Self::send(self.request(reqwest::Method::GET, path)).await
    }

    fn refund_request(&self, order: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, &format!("/orders/{order}/refunds"))
            .header("Idempotency-Key", key)
            .json(body)
    }

    async fn refund(&self, order: &str, key: &str, body: Value) -> (StatusCode, Value) {
        Self::send(self.refund_request(order, key, &body)).await
    }

    /// A refund that is made: 201 and the refund.
    async fn refund_made(&self, order: &str, key: &str, body: Value) -> Value {
        let (status, made) = self.refund(order, key, body).await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        made
    }

    /// The edited refund of ord_55, made with key act_7k2:2.
    async fn edited_refund_made(&self) -> Value {
        self.refund_made("ord_55", "act_7k2:2", edited_refund())
            .await
    }

    /// Asks for the edited refund and gets no answer: the client gives up after a second.
    async fn refund_unanswered(&self, order: &str, key: &str) {
        let timed_out = self
            .refund_request(order, key, &edited_refund())
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .expect_err("no answer");
        assert!(timed_out.is_timeout(), "{timed_out}");
    }

    /// Every refund the service holds, the seeded one included.
    async fn refunds(&self) -> Vec<Value> {
        let (status, refunds) = self.get("/refunds").await;
        assert_eq!(status, StatusCode::OK);
        refunds.as_array().expect("an array").clone()
    }

    async fn refunded_cents(&self, order: &str) -> i64 {
        let (status, order) = self.get(&format!("/orders/{order}")).await;
        assert_eq!(status, StatusCode::OK);
        order["refunded_cents"].as_i64().unwrap()
    }

    fn cli_refunds(&self, json: bool) -> String {
        let mut command = Command::new(env!("CARGO_BIN_EXE_orders"));
        command
            .args(["refunds", "--db"])
            .arg(self.dir.join("orders.db"));
        if json {
            command.arg("--json");
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    }
}

impl Drop for Orders {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The finance manager's edit of the worked example: USD 75 instead of 125.
fn edited_refund() -> Value {
    json!({"order_id": "ord_55", "amount_cents": 7500, "currency": "USD", "reason": "damaged_item"})
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// The answer is a refusal with this status and error code.
#[track_caller]
fn assert_refused((status, body): &(StatusCode, Value), expected: StatusCode, code: &str) {
    assert_eq!(*status, expected, "{body}");
    assert_eq!(error_code(body), code, "{body}");
}

/// The seeded store already holds one refund, ord_42's.
const SEEDED_REFUNDS: usize = 1;

#[tokio::test]
async fn the_seeded_blender_order_is_there_to_refund() {
    let orders = Orders::start("seed");
    let (status, order) = orders.get("/orders/ord_55").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(order["customer"], "cus_18");
    assert_eq!(order["currency"], "USD");
    assert_eq!(order["paid_cents"], 14_900);
    assert_eq!(order["paid"], "149.00");
    assert_eq!(order["refundable_cents"], 14_900);
    assert_eq!(order["items"][0]["quantity"], 1);
    let (status, fully_refunded) = orders.get("/orders/ord_42").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fully_refunded["refundable_cents"], 0);
}

#[tokio::test]
async fn a_refund_and_its_replay_make_one_refund() {
    let orders = Orders::start("replay");

    let made = orders.edited_refund_made().await;
    assert_eq!(made["amount"], "75.00");
    assert_eq!(made["idempotency_key"], "act_7k2:2");

    // The body without order_id asks the same: the path names the order.
    let replay = json!({"amount_cents": 7500, "currency": "USD", "reason": "damaged_item"});
    let (status, replayed) = orders.refund("ord_55", "act_7k2:2", replay).await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_eq!(replayed, made);

    assert_eq!(orders.refunded_cents("ord_55").await, 7_500);
    assert_eq!(orders.refunds().await.len(), SEEDED_REFUNDS + 1);
    for path in ["/refunds/by-key/act_7k2:2", "/refunds/by-key/act_7k2%3A2"] {
        let (status, found) = orders.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(found, made, "{path}");
    }
}

#[tokio::test]
async fn concurrent_posts_with_one_key_make_one_refund() {
    let orders = Orders::start("race");
    let body = edited_refund();
    let answers = all_at_once(
        (0..6)
            .map(|_| Orders::send(orders.refund_request("ord_55", "act_race:2", &body)))
            .collect(),
    )
    .await;
    let created = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "{answers:?}");
    assert!(answers.iter().all(|(status, refund)| {
        status.is_success() && refund["refund_id"] == answers[0].1["refund_id"]
    }));
    assert_eq!(orders.refunded_cents("ord_55").await, 7_500);
}

/// Runs the requests at once on the test's runtime.
async fn all_at_once(
    requests: Vec<impl Future<Output = (StatusCode, Value)> + Send + 'static>,
) -> Vec<(StatusCode, Value)> {
    let tasks: Vec<_> = requests.into_iter().map(tokio::spawn).collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_conflict() {
    let orders = Orders::start("reused");
    orders.edited_refund_made().await;

    let more = json!({"order_id": "ord_55", "amount_cents": 12500, "currency": "USD", "reason": "damaged_item"});
    let answer = orders.refund("ord_55", "act_7k2:2", more).await;
    assert_refused(&answer, StatusCode::CONFLICT, "key_reused");
    assert_eq!(orders.refunded_cents("ord_55").await, 7_500);
}

#[tokio::test]
async fn over_refunds_and_other_currencies_are_refused_and_change_nothing() {
    let orders = Orders::start("limits");
    let too_much = json!({"amount_cents": 14_901, "currency": "USD", "reason": "damaged_item"});
    let euros = json!({"amount_cents": 7_500, "currency": "EUR", "reason": "damaged_item"});
    let nothing = json!({"amount_cents": 0, "currency": "USD", "reason": "damaged_item"});
    let one_cent = json!({"amount_cents": 1, "currency": "USD", "reason": "lost_in_transit"});
    for (order, key, body, code, why) in [
        (
            "ord_55",
            "act_a:1",
            too_much,
            "exceeds_refundable",
            "more than paid",
        ),
        (
            "ord_55",
            "act_b:1",
            euros,
            "currency_mismatch",
            "another currency",
        ),
        ("ord_55", "act_c:1", nothing, "invalid_amount", "nothing"),
        (
            "ord_42",
            "act_d:1",
            one_cent,
            "exceeds_refundable",
            "ord_42 was refunded in full",
        ),
    ] {
        let (status, refused) = orders.refund(order, key, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{why}");
        assert_eq!(error_code(&refused), code, "{why}");
    }

    assert_eq!(orders.refunded_cents("ord_55").await, 0);
    assert_eq!(orders.refunds().await.len(), SEEDED_REFUNDS);
}

#[tokio::test]
async fn refunds_add_up_to_what_was_paid_and_no_further() {
    let orders = Orders::start("sum");
    orders
        .refund_made("ord_55", "act_e:1", edited_refund())
        .await;
    let rest = json!({"amount_cents": 7_400, "currency": "USD", "reason": "damaged_item"});
    orders.refund_made("ord_55", "act_f:1", rest).await;
    let one_more = json!({"amount_cents": 1, "currency": "USD", "reason": "damaged_item"});
    let answer = orders.refund("ord_55", "act_g:1", one_more).await;
    assert_refused(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        "exceeds_refundable",
    );
    assert_eq!(orders.refunded_cents("ord_55").await, 14_900);
}

#[tokio::test]
async fn malformed_requests_are_400_and_change_nothing() {
    let orders = Orders::start("malformed");
    let no_key = orders
        .request(reqwest::Method::POST, "/orders/ord_55/refunds")
        .json(&edited_refund());
    let answer = Orders::send(no_key).await;
    assert_refused(&answer, StatusCode::BAD_REQUEST, "missing_idempotency_key");

    let long_key = "k".repeat(201);
    let unknown_field = json!({"amount_cents": 7500, "currency": "USD", "reason": "damaged_item", "approved_by": "dana"});
    let other_order = json!({"order_id": "ord_77", "amount_cents": 7500, "currency": "USD", "reason": "damaged_item"});
    for (key, body, code) in [
        ("", edited_refund(), "missing_idempotency_key"),
        (long_key.as_str(), edited_refund(), "bad_idempotency_key"),
        ("act_h:1", unknown_field, "bad_request"),
        ("act_i:1", other_order, "order_mismatch"),
    ] {
        let (status, refused) = orders.refund("ord_55", key, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key:?}");
        assert_eq!(error_code(&refused), code, "{key:?}");
    }

    assert_eq!(orders.refunds().await.len(), SEEDED_REFUNDS);
}

#[tokio::test]
async fn unknown_orders_paths_and_methods_answer_json() {
    let orders = Orders::start("unknown");
    let answer = orders.get("/orders/ord_404").await;
    assert_refused(&answer, StatusCode::NOT_FOUND, "not_found");

    let answer = orders
        .refund(
            "ord_404",
            "act_j:1",
            json!({"amount_cents": 100, "currency": "USD", "reason": "x"}),
        )
        .await;
    assert_refused(&answer, StatusCode::NOT_FOUND, "not_found");

    let answer = orders.get("/customers").await;
    assert_refused(&answer, StatusCode::NOT_FOUND, "not_found");

    let answer = Orders::send(orders.request(reqwest::Method::DELETE, "/refunds")).await;
    assert_refused(
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
}

#[tokio::test]
async fn a_lookup_that_finds_nothing_voids_the_key_for_good() {
    let orders = Orders::start("void");
    let (status, body) = orders.get("/refunds/by-key/act_slow%3A2").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "not_found");
    assert!(body["error"]["message"].as_str().unwrap().contains("never"));

    // The slow request arrives after the reconcile decided it did not take effect.
    let answer = orders.refund("ord_55", "act_slow:2", edited_refund()).await;
    assert_refused(&answer, StatusCode::CONFLICT, "key_void");
    assert_eq!(orders.refunded_cents("ord_55").await, 0);
    assert_eq!(orders.refunds().await.len(), SEEDED_REFUNDS);

    let (status, _) = orders.get("/refunds/by-key/act_slow:2").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "still nothing, still void");
}

#[tokio::test]
async fn commit_then_500_answers_500_yet_the_lookup_finds_the_refund() {
    let orders = Orders::start_with("commit500", &["--fault", "commit-then-500"], None);
    let answer = orders.refund("ord_55", "act_lost:2", edited_refund()).await;
    assert_refused(&answer, StatusCode::INTERNAL_SERVER_ERROR, "fault");

    let (status, found) = orders.get("/refunds/by-key/act_lost:2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(found["amount_cents"], 7_500);
    assert_eq!(found["order_id"], "ord_55");

    // A blind retry would also be told 500, but still makes no second refund.
    let (status, _) = orders.refund("ord_55", "act_lost:2", edited_refund()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(orders.refunded_cents("ord_55").await, 7_500);
}

/// A service started with `fault`, whose refund of ord_55 is never answered: the service, and
/// what the lookup by the refund's key then finds.
async fn hung_refund(name: &str, fault: &str) -> (Orders, StatusCode, Value) {
    let orders = Orders::start_with(name, &["--fault", fault], None);
    orders.refund_unanswered("ord_55", "act_hang:2").await;
    let (status, found) = orders.get("/refunds/by-key/act_hang:2").await;
    (orders, status, found)
}

#[tokio::test]
async fn hang_after_commit_never_answers_yet_the_refund_took_effect() {
    let (_orders, status, found) = hung_refund("hangafter", "hang-after-commit").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(found["amount"], "75.00");
}

#[tokio::test]
async fn hang_before_commit_never_answers_and_makes_nothing() {
    let (orders, status, _) = hung_refund("hangbefore", "hang-before-commit").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(orders.refunded_cents("ord_55").await, 0);
}

#[tokio::test]
async fn the_token_is_required_when_orders_token_is_set() {
    let orders = Orders::start_with("token", &[], Some("s3cret"));
    let (status, body) = orders.get("/orders/ord_55").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let anonymous = reqwest::Client::new();
    let url = format!("{}/orders/ord_55", orders.base);
    for request in [
        anonymous.get(&url),
        anonymous.get(&url).bearer_auth("s3cres"),
    ] {
        let (status, body) = Orders::send(request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(error_code(&body), "unauthorized");
    }
    let unsigned_refund = anonymous
        .post(format!("{}/orders/ord_55/refunds", orders.base))
        .header("Idempotency-Key", "act_anon:1")
        .json(&edited_refund());
    let (status, _) = Orders::send(unsigned_refund).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(orders.refunds().await.len(), SEEDED_REFUNDS);
}

#[tokio::test]
async fn orders_refunds_lists_what_was_made() {
    let orders = Orders::start("cli");
    let made = orders.edited_refund_made().await;

    let listed: Value = serde_json::from_str(&orders.cli_refunds(true)).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), SEEDED_REFUNDS + 1);
    assert_eq!(listed.last().unwrap(), &made, "oldest first");

    let text = orders.cli_refunds(false);
    let line = text
        .lines()
        .find(|line| line.contains("act_7k2:2"))
        .unwrap_or_else(|| panic!("no line for the key in:\n{text}"));
    assert!(line.contains("75.00 USD"), "{line}");
    assert!(line.contains("ord_55"), "{line}");
    assert!(line.contains("damaged_item"), "{line}");
}
