//! The form Slack posts to an app's interaction URL, as every test of a Slack click builds it.

/// The body Slack posts for an interaction: `payload=` and the payload's JSON, form-encoded as
/// Slack encodes it (a space as `+`, every other byte but letters, digits and `-_.~` as `%XX`).
pub fn interaction_form(payload: &serde_json::Value) -> String {
    let encoded: String = payload
        .to_string()
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b' ' => "+".to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("payload={encoded}")
}
