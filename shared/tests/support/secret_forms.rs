//! Every form a secret takes on the wire, for tests that hold what is stored or shown to
//! holding none of them: as written, percent-encoded (all of it, in either hex case, or as a
//! URL's query and path encode it), JSON-escaped (once and twice), in base64, and its first
//! half, which a cut could keep.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// `secret` in each form it could be found in.
pub fn forms_of(secret: &str) -> Vec<String> {
    let encoded = |lower: bool| -> String {
        secret
            .bytes()
            .map(|b| match (b.is_ascii_alphanumeric(), lower) {
                (true, _) => (b as char).to_string(),
                (false, false) => format!("%{b:02X}"),
                (false, true) => format!("%{b:02x}"),
            })
            .collect()
    };
    let escaped = |text: &str| {
        let quoted = serde_json::to_string(text).unwrap();
        quoted[1..quoted.len() - 1].to_string()
    };
    let mut url = reqwest::Url::parse("http://x.example/").unwrap();
    url.set_query(Some(secret));
    let query = url.query().unwrap().to_string();
    url.path_segments_mut().unwrap().push(secret);
    let segment = url.path().rsplit('/').next().unwrap().to_string();
    let half = secret
        .char_indices()
        .map(|(at, _)| at)
        .find(|&at| at >= secret.len() / 2)
        .unwrap_or(secret.len());
    vec![
        secret.to_string(),
        encoded(false),
        encoded(true),
        query,
        segment,
        escaped(secret),
        escaped(&escaped(secret)),
        STANDARD.encode(secret),
        secret[..half].to_string(),
    ]
}

/// Fails, naming `what` and the form, if `bytes` hold any form of any of `secrets`.
#[track_caller]
pub fn assert_no_secret_in(what: &str, bytes: &[u8], secrets: &[&str]) {
    for secret in secrets {
        for form in forms_of(secret) {
            if let Some(at) = bytes.windows(form.len()).position(|w| w == form.as_bytes()) {
                let around = &bytes[at.saturating_sub(80)..(at + form.len() + 80).min(bytes.len())];
                panic!(
                    "{what} holds {form:?}, a form of a secret, in: {}",
                    String::from_utf8_lossy(around)
                );
            }
        }
    }
}
