//! What every model API client shares: one HTTPS client, retries with back-off on 408, 409, 429,
//! 5xx and lost connections that honour `retry-after`, a bounded time per turn, and the key (and
//! whatever a `${VAR}` filled into the endpoint) kept out of everything kept or shown: a header
//! marked sensitive, redacted in every form ([`Secrets`]) from what the API says back, an error
//! or an answer.

use std::time::{Duration, SystemTime};

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::Value;
use tokio::time::Instant;

use super::secrets::{self, MIN_SECRET_BYTES, Secrets};
use crate::ports::model::ModelError;

/// How long one turn may take, every attempt and wait included, unless `[model]` says otherwise.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(90);
/// The most tries of one turn.
const ATTEMPTS: u32 = 4;
/// The wait before the second try when the API names none; doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Azure OpenAI and OpenAI may name the wait in milliseconds; it wins over `retry-after`.
const RETRY_AFTER_MS: &str = "retry-after-ms";

/// One model API's endpoint: where turns are posted and the headers (the key among them) each
/// post carries.
pub(crate) struct ModelApi {
    client: reqwest::Client,
    headers: HeaderMap,
    /// The key, and what the endpoint's `${VAR}`s filled in.
    secrets: Secrets,
    turn_timeout: Duration,
}

/// The key and the header that carries it: `prefix` then the key, such as `Bearer sk-…`.
pub(crate) struct ApiKey<'a> {
    pub header: HeaderName,
    pub prefix: &'static str,
    pub key: &'a str,
    /// The environment variable it came from, as an error names it.
    pub variable: &'a str,
}

/// How one try ended when it did not answer.
enum Attempt {
    /// Worth another try, after the wait the API asked for, if it asked.
    Retry(ModelError, Option<Duration>),
    Final(ModelError),
}

impl ModelApi {
    /// Posts carry `headers` and the key, if there is one, in a header marked sensitive.
    /// `secrets` are the endpoint's own (what its `${VAR}`s filled in); the key joins them.
    pub fn new(
        key: Option<ApiKey<'_>>,
        mut headers: HeaderMap,
        mut secrets: Secrets,
        turn_timeout: Duration,
    ) -> Result<Self, String> {
        let client = super::trust::client_builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("no HTTP client: {e}"))?;
        if let Some(ApiKey {
            header,
            prefix,
            key,
            variable,
        }) = key
        {
            let text = format!("{prefix}{key}");
            let mut value = HeaderValue::from_str(&text)
                .map_err(|_| format!("{variable} holds characters no HTTP header may carry"))?;
            value.set_sensitive(true);
            headers.insert(header, value);
            if !key.is_empty() && key.len() < MIN_SECRET_BYTES {
                secrets::warn_too_short("model", variable);
            }
            secrets.add(key);
            secrets.add_header(&text);
        }
        Ok(Self {
            client,
            headers,
            secrets,
            turn_timeout,
        })
    }

    /// Posts one turn's `body` to `url` and returns the answer's JSON, every secret redacted
    /// from it, trying again while the failure may pass and the turn has time left.
    /// `error_message` reads an error body's words.
    pub async fn post(
        &self,
        url: &str,
        body: &Value,
        error_message: fn(&Value) -> Option<String>,
    ) -> Result<Value, ModelError> {
        let deadline = Instant::now() + self.turn_timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (error, asked) = match self.send_once(url, body, left, error_message).await {
                Ok(text) => return Ok(text),
                Err(Attempt::Final(error)) => return Err(error),
                Err(Attempt::Retry(error, _)) if attempt == ATTEMPTS => return Err(error),
                Err(Attempt::Retry(error, asked)) => (error, asked),
            };
            let wait = asked.unwrap_or(backoff);
            let left = deadline.saturating_duration_since(Instant::now());
            if wait >= left {
                let limit = humantime::format_duration(self.turn_timeout);
                return Err(ModelError::Unavailable(format!(
                    "{error}; no time left to try again within the turn's {limit}"
                )));
            }
            tracing::warn!(attempt, ?wait, %error, "model call failed; trying again");
            tokio::time::sleep(wait).await;
            backoff *= 2;
            attempt += 1;
        }
    }

    async fn send_once(
        &self,
        url: &str,
        body: &Value,
        left: Duration,
        error_message: fn(&Value) -> Option<String>,
    ) -> Result<Value, Attempt> {
        if left.is_zero() {
            return Err(Attempt::Final(ModelError::Unavailable(format!(
                "the turn took longer than {}",
                humantime::format_duration(self.turn_timeout)
            ))));
        }
        let lost = |e: reqwest::Error| {
            let why = super::unanswered(&e);
            Attempt::Retry(ModelError::Unavailable(why.to_string()), None)
        };
        let response = self
            .client
            .post(url)
            .headers(self.headers.clone())
            .timeout(left)
            .json(body)
            .send()
            .await
            .map_err(lost)?;
        let status = response.status().as_u16();
        let asked = retry_after(response.headers(), SystemTime::now());
        let text = response.text().await.map_err(lost)?;
        if (200..300).contains(&status) {
            let answer = serde_json::from_str(&text).map_err(|e| {
                Attempt::Final(ModelError::BadReply(format!("the answer is not JSON: {e}")))
            })?;
            return Ok(self.secrets.redact_value(answer));
        }
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| error_message(&v))
            .unwrap_or(text);
        let error = ModelError::Refused {
            status,
            message: self.secrets.redact(&message),
        };
        Err(match status {
            408 | 409 | 429 | 500..=599 => Attempt::Retry(error, asked),
            _ => Attempt::Final(error),
        })
    }
}

/// Refuses a base URL with `user:password@` before its host, which would go out as Basic auth
/// beside the key.
pub(crate) fn refuse_credentials(url: &Url) -> Result<(), String> {
    match url.username().is_empty() && url.password().is_none() {
        true => Ok(()),
        false => Err(
            "carries credentials (user:password@ before the host), which would be \
                      sent as Basic auth: give the key through the API's key variable instead"
                .into(),
        ),
    }
}

/// The wait an answer asks for: `retry-after-ms`, else `retry-after` in seconds or as an HTTP
/// date (a date already past asks for none).
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text(RETRY_AFTER_MS).and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = text(RETRY_AFTER.as_str())?;
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn retry_after_is_read_in_seconds_as_an_http_date_or_in_milliseconds() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
        let wait = |pairs| retry_after(&headers(pairs), now);
        assert_eq!(wait(&[("retry-after", "7")]), Some(Duration::from_secs(7)));
        assert_eq!(
            wait(&[("retry-after", "Wed, 21 Oct 2026 07:28:03 GMT")]),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            wait(&[("retry-after", "Wed, 21 Oct 2026 07:27:00 GMT")]),
            Some(Duration::ZERO),
            "a date already past asks for no wait"
        );
        assert_eq!(
            wait(&[("retry-after", "2"), ("retry-after-ms", "250")]),
            Some(Duration::from_millis(250))
        );
        assert_eq!(wait(&[("retry-after", "soon")]), None);
        assert_eq!(wait(&[]), None);
    }

    #[test]
    fn the_key_and_its_header_are_secrets_beside_the_endpoints_own() {
        let mut endpoint = Secrets::default();
        endpoint.add_variable("LLM_HOST", "llm.internal.example");
        let api = ModelApi::new(
            Some(ApiKey {
                header: reqwest::header::AUTHORIZATION,
                prefix: "Bearer ",
                key: "sk-secret-123",
                variable: "OPENAI_API_KEY",
            }),
            HeaderMap::new(),
            endpoint,
            DEFAULT_TURN_TIMEOUT,
        )
        .unwrap();
        assert_eq!(
            api.secrets
                .redact("Bearer sk-secret-123, sk-secret-123 at llm.internal.example"),
            "[redacted], [redacted] at ${LLM_HOST}"
        );
        assert!(api.headers[reqwest::header::AUTHORIZATION].is_sensitive());
    }
}
