//! The notifier on webhooks: each notice is POSTed as JSON to every configured URL, with a
//! Slack-compatible body (`text` and `blocks`, so a Slack incoming webhook shows it as is), a
//! machine-readable `countersign` object, and an `Idempotency-Key` header that stays the same on
//! every attempt, so a receiver can drop a notice it already has.

use std::fmt::Write as _;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::domain::action::ActionStatus;
use crate::domain::approval::{ApprovalStatus, Choice};
use crate::domain::ids::ApprovalId;
use crate::domain::notice::{Notice, NoticeKind, Posted};
use crate::ports::notifier::{Destination, Notifier, NotifyError};

/// At most this many URLs: each adds one outbox item per approval to the pause transaction.
pub const MAX_WEBHOOKS: usize = 5;
/// How long one post may take, connection included, unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Slack refuses a section's text over 3,000 characters; arguments are cut well before.
const MAX_ARGS_TEXT: usize = 2_000;
const MAX_PROSE: usize = 500;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WebhookConfigError(String);

struct Webhook {
    destination: Destination,
    url: Url,
}

pub struct Webhooks {
    client: reqwest::Client,
    hooks: Vec<Webhook>,
    rendering: Rendering,
}

/// What a notice's message carries besides the approval, the same for every notifier that
/// renders one (these webhooks and the Slack channel).
#[derive(Debug, Clone, Default)]
pub struct Rendering {
    /// The review page's public address: each notice links to its approval there.
    pub public_url: Option<Url>,
    /// A Slack app takes clicks: notices carry Approve and Reject buttons.
    pub buttons: bool,
}

/// The review page's public address, as `COUNTERSIGN_PUBLIC_URL` gives it: http(s), a host, no
/// query or fragment (the link adds its own fragment).
pub fn public_url(text: &str) -> Result<Url, WebhookConfigError> {
    let bad =
        |why: &str| WebhookConfigError(format!("the public URL {:?} {why}", clip(text.trim(), 80)));
    let url = Url::parse(text.trim()).map_err(|e| bad(&format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
        return Err(bad("must be http(s) with a host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("must have no query or fragment"));
    }
    Ok(url)
}

/// The review page opened on one approval: `<public URL>/#approval=<id>`. The fragment never
/// leaves the browser; the page selects the approval, after sign-in if it needs one.
pub fn review_link(public_url: &Url, approval: &ApprovalId) -> String {
    let base = public_url.as_str().trim_end_matches('/');
    format!("{base}/#approval={approval}")
}

/// The URLs of a comma-separated list, such as `COUNTERSIGN_WEBHOOKS`.
pub fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_string)
        .collect()
}

/// `hooks.slack.com`, or `127.0.0.1:8080` when the port is not the scheme's own.
fn host_of(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// A client for posting to Slack or a webhook, each request bounded by `timeout`. It never
/// follows a redirect: an endpoint that redirects is misconfigured, and following it could post
/// elsewhere.
pub(super) fn posting_client(timeout: Duration) -> reqwest::ClientBuilder {
    super::trust::client_builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("countersign/", env!("CARGO_PKG_VERSION")))
}

impl Webhooks {
    /// Posts to these URLs (http or https), each post bounded by `timeout`.
    pub fn new(urls: &[String], timeout: Duration) -> Result<Self, WebhookConfigError> {
        if urls.len() > MAX_WEBHOOKS {
            return Err(WebhookConfigError(format!(
                "{} webhook URLs; at most {MAX_WEBHOOKS}",
                urls.len()
            )));
        }
        let mut hooks: Vec<Webhook> = Vec::new();
        for text in urls {
            let url = Url::parse(text).map_err(|e| {
                WebhookConfigError(format!(
                    "webhook URL {:?} is not a URL: {e}",
                    clip(text, 80)
                ))
            })?;
            if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
                return Err(WebhookConfigError(format!(
                    "webhook URL {:?} must be http(s) with a host",
                    clip(text, 80)
                )));
            }
            // The id names the URL without holding it: Slack webhook paths are secrets.
            let digest = hex::encode(Sha256::digest(url.as_str().as_bytes()));
            let label = host_of(&url);
            let id = format!("{label}#{}", &digest[..12]);
            if hooks.iter().any(|h| h.destination.id == id) {
                continue;
            }
            hooks.push(Webhook {
                destination: Destination {
                    id,
                    label,
                    follows_up: false,
                },
                url,
            });
        }
        let client = posting_client(timeout)
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .build()
            .map_err(|e| WebhookConfigError(format!("no HTTP client: {e}")))?;
        Ok(Self {
            client,
            hooks,
            rendering: Rendering::default(),
        })
    }

    /// Notices carry what `rendering` adds: a link to the review page, Slack's buttons.
    pub fn with_rendering(mut self, rendering: Rendering) -> Self {
        self.rendering = rendering;
        self
    }
}

#[async_trait]
impl Notifier for Webhooks {
    fn destinations(&self) -> Vec<Destination> {
        self.hooks.iter().map(|h| h.destination.clone()).collect()
    }

    async fn send(
        &self,
        destination: &str,
        notice: &Notice,
    ) -> Result<Option<Posted>, NotifyError> {
        let Some(hook) = self.hooks.iter().find(|h| h.destination.id == destination) else {
            return Err(NotifyError::Permanent(format!(
                "no webhook {destination} is configured any more"
            )));
        };
        let response = self
            .client
            .post(hook.url.clone())
            .header("Idempotency-Key", &notice.key)
            .json(&body(notice, &self.rendering))
            .send()
            .await
            .map_err(|e| {
                // The URL may hold a secret: say what failed, not where.
                let what = super::unanswered(&e);
                NotifyError::Transient(format!("{}: {what}", hook.destination.label))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(None);
        }
        let text = response.text().await.unwrap_or_default();
        let error = format!(
            "{} answered {status}: {}",
            hook.destination.label,
            clip(text.trim(), 200)
        );
        match status.as_u16() {
            408 | 425 | 429 | 500..=599 => Err(NotifyError::Transient(error)),
            _ => Err(NotifyError::Permanent(error)),
        }
    }
}

pub(super) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Who decided what, how the approval ended, and what its action did: an outcome notice's part.
fn outcome(notice: &Notice) -> String {
    let a = &notice.approval;
    let mut text = String::new();
    for d in &a.decisions {
        let what = match &d.choice {
            Choice::Approve => format!("approved version {}", d.action_version),
            Choice::Reject { reason } => format!(
                "rejected version {}: {}",
                d.action_version,
                escape(&clip(reason, MAX_PROSE))
            ),
            Choice::Edit { amount, .. } => {
                format!("edited version {} to {amount}", d.action_version)
            }
            Choice::TookEffect { .. } => "said the call took effect".into(),
            Choice::DidNotTakeEffect { .. } => "said the call did not take effect".into(),
        };
        let _ = writeln!(text, "*{}* {what}", escape(d.by.as_str()));
    }
    let status = match a.status {
        ApprovalStatus::AwaitingApproval => format!(
            "Still waiting: {} more approval{} needed.",
            a.still_needed(),
            if a.still_needed() == 1 { "" } else { "s" }
        ),
        ApprovalStatus::Approved => "Approved.".into(),
        ApprovalStatus::Rejected => "Rejected: the agent is told not to retry it.".into(),
        ApprovalStatus::Expired => "Expired: nobody decided by the deadline.".into(),
        ApprovalStatus::Superseded => match &a.superseded_by {
            Some(next) => format!("Replaced by an edit: decide the new version (`{next}`)."),
            None => "Replaced by an edit.".into(),
        },
        ApprovalStatus::Cancelled => "Cancelled with its run.".into(),
        ApprovalStatus::Answered => "Answered.".into(),
    };
    let _ = write!(text, "*Outcome:* {status}");
    if let Some(action) = &notice.action {
        let ran = match action.status {
            ActionStatus::Executing => Some("running"),
            ActionStatus::Succeeded => Some("succeeded"),
            ActionStatus::Failed => Some("failed"),
            ActionStatus::Unknown => Some("unknown (being reconciled; never sent again)"),
            _ => None,
        };
        if let Some(ran) = ran {
            let _ = write!(text, "\n*The call:* {ran}");
            if let Some(result) = action.result.as_deref().filter(|r| !r.trim().is_empty()) {
                let _ = write!(text, ": {}", escape(&clip(result, MAX_PROSE)));
            }
        }
    }
    text
}

/// Slack's mrkdwn treats `&`, `<` and `>` as control characters.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Inside a code block, three backticks would end it early.
fn code(text: &str) -> String {
    escape(text).replace("```", "`\u{200b}``")
}

/// The JSON a notice is posted as; with the review page's public address, it links there, and
/// with `rendering.buttons`, it carries Approve and Reject buttons for a Slack app.
pub fn body(notice: &Notice, rendering: &Rendering) -> Value {
    let a = &notice.approval;
    let link = rendering
        .public_url
        .as_ref()
        .map(|url| review_link(url, &a.id));
    let deadline = a
        .expires_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let waits = a.status == ApprovalStatus::AwaitingApproval;
    let headline = match (notice.kind, a.status) {
        (NoticeKind::Reminder, _) => format!("Reminder: {} still needs a decision", a.tool),
        (NoticeKind::Escalated, _) => format!("Escalated: {} still needs a decision", a.tool),
        (_, ApprovalStatus::AwaitingApproval) => format!("Approval needed: {}", a.tool),
        (_, ApprovalStatus::Approved) => format!("Approved: {}", a.tool),
        (_, ApprovalStatus::Rejected) => format!("Rejected: {}", a.tool),
        (_, ApprovalStatus::Expired) => format!("Expired: {}", a.tool),
        (_, ApprovalStatus::Superseded) => format!("Replaced by an edit: {}", a.tool),
        (_, ApprovalStatus::Cancelled) => format!("Cancelled: {}", a.tool),
        (_, ApprovalStatus::Answered) => format!("Answered: {}", a.tool),
    };
    let args = a.args.canonical();
    let amount = notice.amount.map(|amount| amount.to_string());
    let not_by: Vec<String> = a.requested_by.iter().map(|p| p.to_string()).collect();
    let roles: Vec<String> = a
        .deciding_roles()
        .map(|role| format!("`{}`", escape(role.as_str())))
        .collect();
    let who = format!(
        "a person with the {} role, not {}; {} of {} approval{} still needed",
        roles.join(" or "),
        escape(&not_by.join(", ")),
        a.still_needed(),
        a.quorum,
        if a.quorum == 1 { "" } else { "s" }
    );

    let mut details = String::new();
    let _ = writeln!(details, "*Tool:* `{}`", escape(&a.tool));
    let _ = writeln!(
        details,
        "*Arguments:* ```{}```",
        code(&clip(&args, MAX_ARGS_TEXT))
    );
    if let Some(amount) = &amount {
        let _ = writeln!(details, "*Amount:* {amount}");
    }
    if let Some(previous) = &a.previous {
        let _ = writeln!(
            details,
            "*Edited by {} from version {}:* `{}`",
            escape(previous.edited_by.as_str()),
            previous.version,
            code(&clip(&previous.args.canonical(), MAX_PROSE))
        );
    }
    let _ = writeln!(details, "*Why:* {}", escape(&clip(&a.reason, MAX_PROSE)));
    let _ = writeln!(details, "*Who may approve:* {who}");
    let _ = writeln!(
        details,
        "*Deadline:* <!date^{}^{{date_short_pretty}} {{time}}|{deadline}> ({deadline})",
        a.expires_at.timestamp()
    );
    let _ = write!(
        details,
        "*Approval:* `{}` (version {}, {})",
        a.id,
        a.action_version,
        a.args_hash.short()
    );

    if let Some(link) = &link {
        // A URL inside <…> needs only its own `&`, `<`, `>` escaped; `|` would end it early.
        let _ = write!(
            details,
            "\n*Review:* <{}|Open it on the review page>",
            escape(link).replace('|', "%7C")
        );
    }

    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": clip(&headline, 140)}}),
        json!({"type": "section", "text": {"type": "mrkdwn", "text": details}}),
    ];
    if !a.explanation.trim().is_empty() {
        blocks.push(json!({
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": format!("The agent: {}", escape(&clip(&a.explanation, MAX_PROSE)))}],
        }));
    }
    if notice.kind == NoticeKind::Outcome {
        blocks
            .push(json!({"type": "section", "text": {"type": "mrkdwn", "text": outcome(notice)}}));
    }
    // Once nobody can decide it, the buttons go.
    if let Some(actions) = (rendering.buttons && waits)
        .then(|| super::slack_buttons::buttons(a, notice.editable))
        .flatten()
    {
        blocks.push(actions);
    }
    let text = format!(
        "{headline} {}{} by {deadline} ({})",
        clip(&args, MAX_PROSE),
        amount
            .as_deref()
            .map(|a| format!(", {a}"))
            .unwrap_or_default(),
        a.id
    );
    json!({
        "text": escape(&text),
        "blocks": blocks,
        "countersign": {
            "notice": notice.kind.as_str(),
            "idempotency_key": notice.key,
            "tenant": a.tenant,
            "run_id": a.run_id,
            "approval_id": a.id,
            "action_id": a.action_id,
            "version": a.action_version,
            "args_hash": a.args_hash,
            "tool": a.tool,
            "args": a.args,
            "amount_cents": notice.amount,
            "reason": a.reason,
            "approver_role": a.approver_role,
            "quorum": a.quorum,
            "still_needed": a.still_needed(),
            "not_by": a.requested_by,
            "expires_at": deadline,
            "status": a.status,
            "action_status": notice.action.as_ref().map(|o| o.status),
            "review_url": link,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &str) -> Vec<String> {
        split_list(list)
    }

    #[test]
    fn a_list_splits_on_commas_and_skips_blanks() {
        assert_eq!(
            urls(" https://a.example/x , ,http://127.0.0.1:9/hook"),
            ["https://a.example/x", "http://127.0.0.1:9/hook"]
        );
        assert!(urls("").is_empty());
    }

    #[test]
    fn destinations_name_the_host_and_never_hold_the_url() {
        let hooks = Webhooks::new(
            &urls("https://hooks.slack.com/services/T0/B0/secret,http://127.0.0.1:8080/hook"),
            DEFAULT_TIMEOUT,
        )
        .unwrap();
        let destinations = hooks.destinations();
        let labels: Vec<&str> = destinations.iter().map(|d| d.label.as_str()).collect();
        assert_eq!(labels, ["hooks.slack.com", "127.0.0.1:8080"]);
        assert!(destinations.iter().all(|d| !d.id.contains("secret")));
        assert!(destinations[0].id.starts_with("hooks.slack.com#"));
    }

    #[test]
    fn the_same_url_twice_is_one_destination() {
        let hooks = Webhooks::new(
            &urls("https://a.example/x,https://a.example/x"),
            DEFAULT_TIMEOUT,
        )
        .unwrap();
        assert_eq!(hooks.destinations().len(), 1);
    }

    #[test]
    fn what_is_not_an_http_url_is_refused() {
        for bad in ["not a url", "ftp://a.example/x", "mailto:a@example.com"] {
            assert!(Webhooks::new(&urls(bad), DEFAULT_TIMEOUT).is_err(), "{bad}");
        }
        let many = vec!["https://a.example/x".to_string(); MAX_WEBHOOKS + 1];
        assert!(Webhooks::new(&many, DEFAULT_TIMEOUT).is_err());
    }

    #[test]
    fn a_review_link_opens_the_page_on_the_approval() {
        let id = ApprovalId::parse("ap-abc123").unwrap();
        for base in ["https://review.example", "https://review.example/"] {
            let url = public_url(base).unwrap();
            assert_eq!(
                review_link(&url, &id),
                "https://review.example/#approval=ap-abc123"
            );
        }
        let staged = public_url("https://x.execute-api.example/prod/").unwrap();
        assert_eq!(
            review_link(&staged, &id),
            "https://x.execute-api.example/prod/#approval=ap-abc123"
        );
        for bad in [
            "review.example",
            "ftp://review.example",
            "https://review.example/?a=1",
            "https://review.example/#x",
        ] {
            assert!(public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mrkdwn_control_characters_are_escaped() {
        assert_eq!(escape("a <b> & c"), "a &lt;b&gt; &amp; c");
        assert_eq!(code("x```y"), "x`\u{200b}``y");
    }
}
