//! A Slack interaction sent over HTTP, as the tests of a server's Slack endpoint send it.

/// Posts an interaction's `body` to `{base}/slack/interactions` with Slack's signature headers:
/// the status and the JSON answer.
pub async fn post_interaction(
    http: &reqwest::Client,
    base: &str,
    body: &str,
    timestamp: &str,
    signature: &str,
) -> (u16, serde_json::Value) {
    let reply = http
        .post(format!("{base}/slack/interactions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", timestamp)
        .header("x-slack-signature", signature)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    (status, reply.json().await.unwrap())
}
