//! A Slack app for deciding where reviewers are: the Approve and Reject buttons a notice carries,
//! and the verification of the interaction requests Slack sends when one is clicked.
//!
//! Slack signs each request with the app's signing secret: `X-Slack-Signature` is `v0=` and the
//! hex HMAC-SHA256 of `v0:{X-Slack-Request-Timestamp}:{body}`. A request is taken only if its
//! signature verifies (compared in constant time) and its timestamp is at most five minutes
//! from now. The secret is never logged, printed or shown by `Debug`.

use std::time::Duration;

use reqwest::Url;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::slack_buttons::ACTION_PREFIX;
use crate::domain::approval::Approval;
use crate::domain::identity::{Directory, Identity};
use crate::domain::notice::{Notice, NoticeKind, Posted};
use crate::ports::notifier::{Notifier, NotifyError};

pub use super::slack_buttons::{ButtonChoice, action_id, buttons};

/// How far a request's timestamp may be from now, either way.
pub const MAX_REQUEST_AGE_SECS: i64 = 5 * 60;
/// Where Slack's `response_url`s point, unless configured otherwise.
pub const SLACK_HOOKS_URL: &str = "https://hooks.slack.com/";
/// How long an answer to Slack may take: Slack wants the request acknowledged within 3 s.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SlackConfigError(String);

/// Why an interaction request is not taken. Nothing is changed for any of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no X-Slack-Signature or X-Slack-Request-Timestamp header")]
    Missing,
    #[error("X-Slack-Request-Timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("the request is more than five minutes old (or from the future): a replay is refused")]
    TooOld,
    #[error("the X-Slack-Signature does not match the request")]
    Mismatch,
}

/// The app's signing secret. `Debug` never shows it.
#[derive(Clone)]
pub struct SigningSecret(String);

impl SigningSecret {
    pub fn new(secret: &str) -> Result<Self, SlackConfigError> {
        let secret = secret.trim();
        if secret.len() < 16 {
            return Err(SlackConfigError(
                "the Slack signing secret is too short: copy it from the app's Basic Information page"
                    .into(),
            ));
        }
        Ok(Self(secret.to_string()))
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(…)")
    }
}

fn hmac_sha256(key: &[u8], message: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in message {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Equal without saying where two byte strings first differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `v0=<hex>`: the signature Slack sends with `body` at `timestamp`.
pub fn sign(secret: &SigningSecret, timestamp: &str, body: &[u8]) -> String {
    let mac = hmac_sha256(
        secret.0.as_bytes(),
        &[b"v0:", timestamp.as_bytes(), b":", body],
    );
    format!("v0={}", hex::encode(mac))
}

/// Checks a request as Slack documents: a fresh timestamp, and the signature over it and the
/// body, compared in constant time.
pub fn verify(
    secret: &SigningSecret,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<(), SignatureError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(SignatureError::Missing);
    };
    let at: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    if (now_secs - at).abs() > MAX_REQUEST_AGE_SECS {
        return Err(SignatureError::TooOld);
    }
    let expected = sign(secret, timestamp.trim(), body);
    if !constant_time_eq(expected.as_bytes(), signature.trim().as_bytes()) {
        return Err(SignatureError::Mismatch);
    }
    Ok(())
}

/// What a button was rendered for, read back from a click: the choice from its action id, the
/// approval, version and args hash from its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Button {
    pub action_id: String,
    pub choice: ButtonChoice,
    pub approval: String,
    pub version: u32,
    pub args_hash: String,
}

impl Button {
    /// The button of a `block_actions` action, or why it is not one of Countersign's.
    pub fn of_action(action: &Value) -> Result<Self, String> {
        let action_id = action["action_id"].as_str().unwrap_or_default();
        let rest = action_id
            .strip_prefix(ACTION_PREFIX)
            .ok_or_else(|| format!("action {:?} is not Countersign's", clip(action_id)))?;
        let choice = match rest.split('.').next() {
            Some("approve") => ButtonChoice::Approve,
            Some("reject") => ButtonChoice::Reject,
            Some("edit") => ButtonChoice::Edit,
            _ => return Err(format!("action {:?} names no choice", clip(action_id))),
        };
        let value: Value = action["value"]
            .as_str()
            .and_then(|v| serde_json::from_str(v).ok())
            .ok_or("the button carries no value")?;
        Self::of_value(action_id, choice, &value)
    }

    /// The button an edit form was opened from, as its `private_metadata` keeps it.
    pub fn of_metadata(metadata: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(metadata).map_err(|_| "the form's metadata is not JSON")?;
        let action_id = value["action_id"].as_str().unwrap_or_default();
        if !action_id.starts_with(&format!("{ACTION_PREFIX}edit.")) {
            return Err("the form is not an edit of Countersign's".into());
        }
        Self::of_value(action_id, ButtonChoice::Edit, &value)
    }

    fn of_value(action_id: &str, choice: ButtonChoice, value: &Value) -> Result<Self, String> {
        let approval = value["approval"]
            .as_str()
            .ok_or("the button names no approval")?;
        let version = value["version"]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or("the button names no version")?;
        let args_hash = value["args_hash"]
            .as_str()
            .ok_or("the button names no args hash")?;
        if action_id != format!("{ACTION_PREFIX}{}.{approval}.v{version}", choice.as_str()) {
            return Err("the button's action id and value disagree".into());
        }
        Ok(Self {
            action_id: action_id.to_string(),
            choice,
            approval: approval.to_string(),
            version,
            args_hash: args_hash.to_string(),
        })
    }
}

fn clip(text: &str) -> String {
    text.chars().take(80).collect()
}

/// The edit form (a modal) for one approval version: the new amount, lower than `cents`, and a
/// note. `private_metadata` keeps the button it was opened from.
pub fn edit_modal(approval: &Approval, button: &Button, cents: i64) -> Value {
    let metadata = json!({
        "action_id": button.action_id,
        "approval": approval.id,
        "version": approval.action_version,
        "args_hash": approval.args_hash,
    })
    .to_string();
    let now = format!("{}.{:02}", cents / 100, cents % 100);
    json!({
        "type": "modal",
        "callback_id": EDIT_CALLBACK,
        "private_metadata": metadata,
        "title": {"type": "plain_text", "text": format!("Edit version {}", approval.action_version)},
        "submit": {"type": "plain_text", "text": "Approve the lower amount"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": format!(
                "`{}` asks ${now} now. An edit may only lower it, and counts as your approval of the new version.",
                approval.tool
            )}},
            {"type": "input", "block_id": "amount", "label": {"type": "plain_text", "text": "New amount in dollars"},
             "element": {"type": "plain_text_input", "action_id": "value", "initial_value": now}},
            {"type": "input", "block_id": "note", "optional": true, "label": {"type": "plain_text", "text": "Why (for the record)"},
             "element": {"type": "plain_text_input", "action_id": "value", "multiline": true, "max_length": 2000}},
        ],
    })
}

/// The `callback_id` of the edit form.
pub const EDIT_CALLBACK: &str = "countersign.edit";

/// The Slack app as the decision API uses it: the signing secret, who each Slack user is, and
/// where answers to interactions may go.
pub struct SlackApp {
    secret: SigningSecret,
    people: Directory,
    hooks_url: Url,
    client: reqwest::Client,
    /// With a bot token: the Web API, to open the edit form.
    web: Option<WebApi>,
}

impl SlackApp {
    /// `people` maps Slack user ids to persons (their `slack` field); `hooks_url` is the prefix
    /// every `response_url` must have (Slack's own, [`SLACK_HOOKS_URL`], outside tests).
    pub fn new(
        secret: SigningSecret,
        people: Directory,
        hooks_url: &str,
    ) -> Result<Self, SlackConfigError> {
        let hooks_url = Url::parse(hooks_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "https" | "http") && u.host_str().is_some())
            .ok_or_else(|| {
                SlackConfigError(format!(
                    "the Slack hooks URL {:?} is not an http(s) URL",
                    clip(hooks_url)
                ))
            })?;
        let client = super::webhook::posting_client(RESPONSE_TIMEOUT)
            .build()
            .map_err(|e| SlackConfigError(format!("no HTTP client: {e}")))?;
        Ok(Self {
            secret,
            people,
            hooks_url,
            client,
            web: None,
        })
    }

    /// The Web API with the app's bot token: Edit opens its form (`views.open`).
    pub fn with_web_api(mut self, web: Option<WebApi>) -> Self {
        self.web = web;
        self
    }

    /// Opens `view` for the person whose click gave `trigger_id`; why not, if it fails.
    pub async fn open_view(&self, trigger_id: &str, view: &Value) -> Result<(), String> {
        let Some(web) = &self.web else {
            return Err("this Slack app has no bot token to open a form with".into());
        };
        let body = json!({"trigger_id": trigger_id, "view": view});
        match web.call("views.open", &body).await {
            Ok(_) => Ok(()),
            Err(CallError::Transient(why) | CallError::Refused(why, _)) => Err(why),
        }
    }

    pub fn verify(
        &self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_secs: i64,
    ) -> Result<(), SignatureError> {
        verify(&self.secret, timestamp, signature, body, now_secs)
    }

    /// The person a Slack user is, by the people directory's `slack` ids.
    pub fn person(&self, slack_user: &str) -> Option<Identity> {
        self.people.by_slack_user(slack_user)
    }

    /// Posts `message` to an interaction's `response_url`, if it is Slack's: a message to the
    /// person who clicked. Failures are logged (without the URL, which is a credential).
    pub async fn respond(&self, response_url: &str, message: &Value) {
        let Ok(url) = Url::parse(response_url) else {
            tracing::warn!("the interaction's response_url is not a URL; no answer sent");
            return;
        };
        if !url.as_str().starts_with(self.hooks_url.as_str()) {
            tracing::warn!(host = ?url.host_str(), "the interaction's response_url is not Slack's; no answer sent");
            return;
        }
        match self.client.post(url).json(message).send().await {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => {
                tracing::warn!(status = %response.status(), "Slack refused the answer to an interaction")
            }
            Err(error) => {
                tracing::warn!(
                    timeout = error.is_timeout(),
                    "the answer to an interaction was not delivered"
                )
            }
        }
    }
}

/// Slack's Web API, unless configured otherwise.
pub const SLACK_API_URL: &str = "https://slack.com/api/";

/// Slack `error`s worth trying again later; any other is a refusal that will not change.
const TRANSIENT_ERRORS: &[&str] = &[
    "ratelimited",
    "rate_limited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];
/// `chat.update` errors that mean the message is gone: nothing to update, not a failure.
const GONE: &[&str] = &[
    "message_not_found",
    "cant_update_message",
    "channel_not_found",
];

/// A bot token. `Debug` never shows it.
#[derive(Clone)]
struct BotToken(String);

impl std::fmt::Debug for BotToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BotToken(…)")
    }
}

/// Slack's Web API with a bot token: `POST {api}/{method}`, JSON in and out.
#[derive(Clone)]
pub struct WebApi {
    client: reqwest::Client,
    api: Url,
    token: BotToken,
}

impl WebApi {
    pub fn new(api_url: &str, token: &str, timeout: Duration) -> Result<Self, SlackConfigError> {
        let mut api = Url::parse(api_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "https" | "http") && u.host_str().is_some())
            .ok_or_else(|| {
                SlackConfigError(format!(
                    "the Slack API URL {:?} is not an http(s) URL",
                    clip(api_url)
                ))
            })?;
        if !api.path().ends_with('/') {
            api.set_path(&format!("{}/", api.path()));
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(SlackConfigError("the Slack bot token is empty".into()));
        }
        let client = super::webhook::posting_client(timeout)
            .connect_timeout(super::webhook::CONNECT_TIMEOUT.min(timeout))
            .build()
            .map_err(|e| SlackConfigError(format!("no HTTP client: {e}")))?;
        Ok(Self {
            client,
            api,
            token: BotToken(token.to_string()),
        })
    }

    /// One Web API call: the answer's JSON when Slack says `ok`, else why not.
    async fn call(&self, method: &str, body: &Value) -> Result<Value, CallError> {
        let url = self.api.join(method).expect("a Web API method name joins");
        let response = self
            .client
            .post(url)
            .bearer_auth(&self.token.0)
            .json(body)
            .send()
            .await
            .map_err(|e| CallError::Transient(format!("{method}: {}", super::unanswered(&e))))?;
        let status = response.status();
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(CallError::Transient(format!(
                "{method}: Slack answered {status}"
            )));
        }
        if !status.is_success() {
            return Err(CallError::Refused(
                format!("{method}: Slack answered {status}"),
                String::new(),
            ));
        }
        let answer: Value = response
            .json()
            .await
            .map_err(|_| CallError::Transient(format!("{method}: the answer is not JSON")))?;
        if answer["ok"] == true {
            return Ok(answer);
        }
        let error = answer["error"]
            .as_str()
            .unwrap_or("unknown_error")
            .to_string();
        let message = format!("{method}: Slack said {}", clip(&error));
        match TRANSIENT_ERRORS.contains(&error.as_str()) {
            true => Err(CallError::Transient(message)),
            false => Err(CallError::Refused(message, error)),
        }
    }

    fn host(&self) -> String {
        match self.api.port() {
            Some(port) => format!("{}:{port}", self.api.host_str().unwrap_or_default()),
            None => self.api.host_str().unwrap_or_default().to_string(),
        }
    }
}

/// Notices posted to one Slack channel through the Web API (`chat.postMessage`, which answers
/// with the message's channel and `ts`), and updated in place (`chat.update`) with the
/// approval's outcome: the buttons go, who decided what and what the call did appear.
pub struct SlackChannel {
    web: WebApi,
    channel: String,
    destination: crate::ports::notifier::Destination,
    rendering: super::webhook::Rendering,
}

impl SlackChannel {
    /// Posts to `channel` (an id such as `C0123456789`, or `#name`) with a bot token that has
    /// `chat:write`, through the Web API at `api_url` (Slack's own, [`SLACK_API_URL`], outside
    /// tests), each call bounded by `timeout`.
    pub fn new(
        api_url: &str,
        token: &str,
        channel: &str,
        timeout: Duration,
    ) -> Result<Self, SlackConfigError> {
        let web = WebApi::new(api_url, token, timeout)?;
        let channel = channel.trim();
        let well_formed = !channel.is_empty()
            && channel.len() <= 80
            && channel
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '#' | '-' | '_' | '.'));
        if !well_formed {
            return Err(SlackConfigError(format!(
                "the Slack channel {:?} is not a channel id or #name",
                clip(channel)
            )));
        }
        let host = web.host();
        Ok(Self {
            destination: crate::ports::notifier::Destination {
                id: format!("slack-api:{channel}"),
                label: format!("{host} {channel}"),
                follows_up: true,
            },
            web,
            channel: channel.to_string(),
            rendering: Default::default(),
        })
    }

    /// Notices carry what `rendering` adds: a link to the review page, the app's buttons.
    pub fn with_rendering(mut self, rendering: super::webhook::Rendering) -> Self {
        self.rendering = rendering;
        self
    }

    fn message(&self, notice: &Notice) -> Value {
        let mut body = super::webhook::body(notice, &self.rendering);
        json!({
            "channel": self.channel,
            "text": body["text"].take(),
            "blocks": body["blocks"].take(),
            "unfurl_links": false,
            "unfurl_media": false,
        })
    }
}

enum CallError {
    Transient(String),
    /// Slack refused the call; the `error` code it gave.
    Refused(String, String),
}

impl From<CallError> for NotifyError {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Transient(message) => NotifyError::Transient(message),
            CallError::Refused(message, _) => NotifyError::Permanent(message),
        }
    }
}

#[async_trait::async_trait]
impl Notifier for SlackChannel {
    fn destinations(&self) -> Vec<crate::ports::notifier::Destination> {
        vec![self.destination.clone()]
    }

    async fn send(
        &self,
        destination: &str,
        notice: &Notice,
    ) -> Result<Option<Posted>, NotifyError> {
        if destination != self.destination.id {
            return Err(NotifyError::Permanent(format!(
                "no Slack channel {destination} is configured any more"
            )));
        }
        let message = self.message(notice);
        if notice.kind != NoticeKind::Outcome {
            let answer = self.web.call("chat.postMessage", &message).await?;
            let (Some(channel), Some(ts)) = (answer["channel"].as_str(), answer["ts"].as_str())
            else {
                return Err(NotifyError::Permanent(
                    "chat.postMessage answered ok without the message's channel and ts".into(),
                ));
            };
            return Ok(Some(Posted {
                destination: self.destination.id.clone(),
                channel: channel.to_string(),
                ts: ts.to_string(),
            }));
        }
        // Every message posted about the approval, in place. Updates are idempotent: after a
        // failure, all are sent again.
        for posted in &notice.posted {
            let mut update = message.clone();
            update["channel"] = json!(posted.channel);
            update["ts"] = json!(posted.ts);
            match self.web.call("chat.update", &update).await {
                Ok(_) => {}
                Err(CallError::Refused(message, error)) if GONE.contains(&error.as_str()) => {
                    tracing::info!(%message, "the message to update is gone");
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(None)
    }
}

/// An ephemeral message: shown only to the person who clicked, leaving the notice as it is.
pub fn ephemeral(text: &str) -> Value {
    json!({
        "response_type": "ephemeral",
        "replace_original": false,
        "text": text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(
            &[0xaa; 131],
            &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
        );
        assert_eq!(
            hex::encode(mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn secret() -> SigningSecret {
        SigningSecret::new("8f742231b10e8888abcd99yyyzzz85a5").unwrap()
    }

    #[test]
    fn a_signed_request_verifies_and_anything_else_is_refused() {
        use SignatureError::{BadTimestamp, Mismatch, Missing, TooOld};

        let body = b"payload=%7B%7D";
        let signature = sign(&secret(), "1531420618", body);
        assert!(signature.starts_with("v0=") && signature.len() == 67);
        let at = 1_531_420_618;
        let ours = secret();
        let other = SigningSecret::new("another-secret-of-some-length").unwrap();
        let sent = Some("1531420618");
        let cases: [(_, _, &[u8], _, _); 7] = [
            (&ours, sent, body, at + 10, Ok(())),
            (&ours, sent, b"payload=%7B%7Dx", at, Err(Mismatch)),
            (&other, sent, body, at, Err(Mismatch)),
            (&ours, sent, body, at + 301, Err(TooOld)),
            (&ours, sent, body, at - 301, Err(TooOld)),
            (&ours, Some("soon"), body, at, Err(BadTimestamp)),
            (&ours, None, body, at, Err(Missing)),
        ];
        for (secret, timestamp, body, now, expected) in cases {
            assert_eq!(
                verify(secret, timestamp, Some(&signature), body, now),
                expected,
                "{timestamp:?} {:?} at {now}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn the_secret_never_shows() {
        let shown = format!("{:?}", secret());
        assert!(!shown.contains("8f74"), "{shown}");
        assert!(SigningSecret::new("short").is_err());
    }

    #[test]
    fn a_button_reads_back_only_when_its_action_id_and_value_agree() {
        let value = json!({"approval": "ap-1", "version": 2, "args_hash": "abc"}).to_string();
        let action = json!({"action_id": "countersign.approve.ap-1.v2", "value": value});
        let button = Button::of_action(&action).unwrap();
        assert_eq!(button.choice, ButtonChoice::Approve);
        assert_eq!((button.approval.as_str(), button.version), ("ap-1", 2));
        for bad in [
            json!({"action_id": "countersign.approve.ap-1.v1", "value": value}),
            json!({"action_id": "countersign.reject.ap-2.v2", "value": value}),
            json!({"action_id": "other.approve.ap-1.v2", "value": value}),
            json!({"action_id": "countersign.approve.ap-1.v2"}),
        ] {
            assert!(Button::of_action(&bad).is_err(), "{bad}");
        }
    }
}
