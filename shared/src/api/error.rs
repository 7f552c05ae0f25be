//! Every failure the API returns: a status, a stable code, and a sentence, as
//! `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::auth::AuthError;
use crate::engine::{EngineError, ErrorKind};

/// An error response. Build it from an [`EngineError`], an [`AuthError`], or one of the
/// constructors for what the API layer itself refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// The one status each kind of engine error gets.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::PolicyRefused => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::NotConfigured => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::TooMany => StatusCode::TOO_MANY_REQUESTS,
    }
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: the request itself is wrong; sending it again unchanged fails again.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 408: the body did not arrive within `within` of its head; the connection ends.
    pub fn request_timeout(within: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the body did not arrive within {}",
                humantime::format_duration(within)
            ),
        )
    }

    /// 414: a request line longer than `limit` bytes (the longest path the API has is a few
    /// dozen characters).
    pub fn uri_too_long(limit: usize) -> Self {
        Self::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!(
                "the request line is longer than {limit} bytes; no path of this API is nearly as long"
            ),
        )
    }

    /// 431: a request head over `limit` bytes, or with more than `headers` header lines.
    pub fn headers_too_large(limit: usize, headers: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request's headers are larger than {limit} bytes or more than {headers}"),
        )
    }

    /// 429: the caller already has as many requests waiting as one person may, or the server
    /// as many as it takes; the answer says when to ask again.
    pub fn too_many_waits(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_waits", message)
    }

    pub fn no_route(method: &str, path: &str) -> Self {
        let path: String = path.chars().take(200).collect();
        Self::new(
            StatusCode::NOT_FOUND,
            "no_route",
            format!("there is no {method} {path}"),
        )
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        let path: String = path.chars().take(200).collect();
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{path} does not take {method}"),
        )
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let status = status_of(error.kind());
        // A failing store or dependency is logged in full and told to the caller in general
        // terms; a setting the server lacks is told as it is (a variable's name, never a value).
        let message = match error.kind() {
            ErrorKind::Unavailable => {
                tracing::error!(%error, code = error.code(), "unavailable");
                "the service cannot complete this now; try again later".to_string()
            }
            ErrorKind::NotConfigured => {
                tracing::error!(%error, code = error.code(), "not configured");
                error.to_string()
            }
            _ => error.to_string(),
        };
        Self {
            status,
            code: error.code(),
            message,
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, error.code(), error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, Json(body)).into_response();
        // As every JSON answer of the API, wherever in the stack this one is made.
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::approval::{ApprovalStatus, Refusal};
    use crate::domain::identity::DirectoryError;
    use crate::domain::ids::{ActionVersion, PersonId, Role};
    use crate::domain::money::Amount;
    use crate::domain::policy::EditRefusal;
    use crate::ports::store::StoreError;

    fn mapped(error: EngineError) -> (u16, &'static str) {
        let api = ApiError::from(error);
        (api.status.as_u16(), api.code)
    }

    #[test]
    fn refusals_of_a_person_are_403() {
        let ben = PersonId::parse("ben").unwrap();
        assert_eq!(
            mapped(
                Refusal::OwnRequest {
                    person: ben.clone()
                }
                .into()
            ),
            (403, "own_request")
        );
        let role = Role::parse("finance").unwrap();
        assert_eq!(
            mapped(Refusal::MissingRole { person: ben, role }.into()),
            (403, "missing_role")
        );
        assert_eq!(
            mapped(DirectoryError::UnknownPerson("mallory".into()).into()),
            (403, "unknown_person")
        );
    }

    #[test]
    fn unknown_or_another_tenants_is_404() {
        assert_eq!(
            mapped(EngineError::not_found("approval ap-x")),
            (404, "not_found")
        );
    }

    #[test]
    fn a_state_that_moved_on_is_409_with_its_own_code() {
        let resolved = |status| Refusal::AlreadyResolved { status }.into();
        assert_eq!(
            mapped(resolved(ApprovalStatus::Approved)),
            (409, "already_decided")
        );
        assert_eq!(
            mapped(resolved(ApprovalStatus::Cancelled)),
            (409, "cancelled")
        );
        assert_eq!(mapped(resolved(ApprovalStatus::Expired)), (409, "expired"));
        let stale = Refusal::StaleVersion {
            sent: ActionVersion::FIRST.next(),
            current: ActionVersion::FIRST,
        };
        assert_eq!(mapped(stale.into()), (409, "stale_version"));
        let superseded = Refusal::Superseded { current: None };
        assert_eq!(mapped(superseded.into()), (409, "superseded"));
        let late = Refusal::Expired {
            expires_at: chrono::Utc::now(),
        };
        assert_eq!(mapped(late.into()), (409, "expired"));
    }

    #[test]
    fn an_edit_policy_refuses_is_422() {
        let refusal = Refusal::Edit(EditRefusal::NotLower {
            old: Amount::from_dollars(250),
            new: Amount::from_dollars(300),
        });
        assert_eq!(mapped(refusal.into()), (422, "edit_refused"));
        assert_eq!(
            mapped(EngineError::PolicyRefused("denied".into())),
            (422, "policy_refused")
        );
    }

    #[test]
    fn bad_input_is_400_and_a_failing_store_is_503_without_its_details() {
        assert_eq!(
            mapped(Refusal::EmptyReason.into()),
            (400, "reason_required")
        );
        assert_eq!(
            mapped(EngineError::BadInput("too long".into())),
            (400, "bad_input")
        );
        let store = ApiError::from(EngineError::Store(StoreError::Unavailable(
            "/var/secret/path.db is locked".into(),
        )));
        assert_eq!((store.status.as_u16(), store.code), (503, "unavailable"));
        assert!(!store.message.contains("/var/secret"), "{}", store.message);
    }

    #[test]
    fn a_setting_the_server_lacks_is_500_naming_it_not_a_503_to_try_again() {
        let error = ApiError::from(EngineError::NotConfigured(
            "the agent oai has no model in this process: OPENAI_API_KEY is not set".into(),
        ));
        assert_eq!((error.status.as_u16(), error.code), (500, "not_configured"));
        assert!(
            error.message.contains("OPENAI_API_KEY"),
            "{}",
            error.message
        );
        assert!(!error.message.contains("try again"), "{}", error.message);
    }

    #[test]
    fn authentication_failures_are_401() {
        let api = ApiError::from(AuthError::Missing);
        assert_eq!((api.status.as_u16(), api.code), (401, "missing_token"));
        let api = ApiError::from(AuthError::Expired);
        assert_eq!((api.status.as_u16(), api.code), (401, "token_expired"));
    }

    #[tokio::test]
    async fn the_body_is_the_error_object_and_a_401_names_the_scheme() {
        let response = ApiError::from(AuthError::Missing).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let bytes = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["code"], "missing_token");
        assert!(body["error"]["message"].as_str().unwrap().contains("token"));
    }

    /// One engine error of each kind. The match names every variant without a wildcard, so a
    /// new variant does not compile until it has a sample here, and so a code in the document.
    fn every_engine_error() -> Vec<EngineError> {
        use crate::domain::approval::ApprovalKind;
        use crate::domain::gate::GateRefusal;
        use crate::domain::ids::DecisionId;
        use crate::domain::run::RunStatus;

        let ben = PersonId::parse("ben").unwrap();
        let refusals = vec![
            Refusal::OwnRequest {
                person: ben.clone(),
            },
            Refusal::MissingRole {
                person: ben.clone(),
                role: Role::parse("finance").unwrap(),
            },
            Refusal::AlreadyResolved {
                status: ApprovalStatus::Approved,
            },
            Refusal::AlreadyResolved {
                status: ApprovalStatus::Cancelled,
            },
            Refusal::AlreadyResolved {
                status: ApprovalStatus::Expired,
            },
            Refusal::Superseded { current: None },
            Refusal::StaleVersion {
                sent: ActionVersion::FIRST.next(),
                current: ActionVersion::FIRST,
            },
            Refusal::Expired {
                expires_at: chrono::Utc::now(),
            },
            Refusal::AlreadyApprovedBy { person: ben },
            Refusal::DecisionIdReused {
                decision_id: DecisionId::parse("d-1").unwrap(),
            },
            Refusal::Edit(EditRefusal::ToZero),
            Refusal::EmptyReason,
            Refusal::WrongChoice {
                kind: ApprovalKind::Recovery,
            },
        ];
        let mut errors: Vec<EngineError> = refusals.into_iter().map(Into::into).collect();
        errors.extend([
            EngineError::BadInput("bad".into()),
            EngineError::not_found("approval ap-x"),
            EngineError::RunFinished {
                run: "run-1".into(),
                status: RunStatus::Done,
            },
            EngineError::MayNotCancel {
                who: "zoe".into(),
                run: "run-1".into(),
            },
            EngineError::PolicyRefused("denied".into()),
            DirectoryError::UnknownPerson("mallory".into()).into(),
            DirectoryError::Invalid("no people".into()).into(),
            EngineError::Contended,
            EngineError::TooManyComments("full".into()),
            EngineError::TooManyOpenApprovals {
                requester: "ben".into(),
                limit: 100,
            },
            StoreError::Invalid("too large".into()).into(),
            StoreError::Unavailable("down".into()).into(),
            StoreError::Contended.into(),
            StoreError::ConditionFailed { failed: vec![0] }.into(),
            StoreError::TooLarge {
                what: "an item".into(),
                limit: 400 * 1024,
            }
            .into(),
            StoreError::Throttled("busy".into()).into(),
            EngineError::Corrupt("unreadable".into()),
            EngineError::Unavailable("down".into()),
            EngineError::NotConfigured("OPENAI_API_KEY is not set".into()),
        ]);
        let call = || "run-1".to_string();
        errors.extend(
            [
                GateRefusal::CallIdReused {
                    call_id: "call_1".into(),
                },
                GateRefusal::NotRequester { call: call() },
                GateRefusal::NotClaimable {
                    call: call(),
                    status: "rejected".into(),
                },
                GateRefusal::Claimed { call: call() },
                GateRefusal::OutcomeRecorded {
                    call: call(),
                    status: "succeeded".into(),
                },
            ]
            .map(EngineError::from),
        );
        for error in &errors {
            match error {
                EngineError::BadInput(_)
                | EngineError::NotFound { .. }
                | EngineError::RunFinished { .. }
                | EngineError::MayNotCancel { .. }
                | EngineError::PolicyRefused(_)
                | EngineError::Contended
                | EngineError::TooManyComments(_)
                | EngineError::TooManyOpenApprovals { .. }
                | EngineError::Corrupt(_)
                | EngineError::Unavailable(_)
                | EngineError::NotConfigured(_)
                | EngineError::Directory(DirectoryError::UnknownPerson(_))
                | EngineError::Directory(DirectoryError::Invalid(_))
                | EngineError::Store(StoreError::ConditionFailed { .. })
                | EngineError::Store(StoreError::Contended)
                | EngineError::Store(StoreError::Invalid(_))
                | EngineError::Store(StoreError::TooLarge { .. })
                | EngineError::Store(StoreError::Throttled(_))
                | EngineError::Store(StoreError::Unavailable(_)) => {}
                EngineError::Gate(refusal) => match refusal {
                    GateRefusal::CallIdReused { .. }
                    | GateRefusal::NotRequester { .. }
                    | GateRefusal::NotClaimable { .. }
                    | GateRefusal::Claimed { .. }
                    | GateRefusal::OutcomeRecorded { .. } => {}
                },
                EngineError::Refused(refusal) => match refusal {
                    Refusal::OwnRequest { .. }
                    | Refusal::MissingRole { .. }
                    | Refusal::AlreadyResolved { .. }
                    | Refusal::Superseded { .. }
                    | Refusal::StaleVersion { .. }
                    | Refusal::Expired { .. }
                    | Refusal::AlreadyApprovedBy { .. }
                    | Refusal::DecisionIdReused { .. }
                    | Refusal::Edit(_)
                    | Refusal::EmptyReason
                    | Refusal::WrongChoice { .. } => {}
                },
            }
        }
        errors
    }

    /// Every authentication failure, named the same way.
    fn every_auth_error() -> Vec<AuthError> {
        let errors = vec![
            AuthError::Missing,
            AuthError::Repeated,
            AuthError::Invalid("signature"),
            AuthError::Expired,
            AuthError::NotYetValid,
            AuthError::Claims("no tenant".into()),
        ];
        for error in &errors {
            match error {
                AuthError::Missing
                | AuthError::Repeated
                | AuthError::Invalid(_)
                | AuthError::Expired
                | AuthError::NotYetValid
                | AuthError::Claims(_) => {}
            }
        }
        errors
    }

    /// The codes the API layer writes itself: the literal first argument of `bad_request`, the
    /// literal code given to `new`, and the codes `parse_json` maps serde's errors to (match
    /// arms giving a text with an underscore).
    fn codes_written_in(source: &'static str) -> Vec<&'static str> {
        let is_code = |text: &str| {
            !text.is_empty() && text.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        };
        let quoted = |text: &'static str| {
            let code = text.trim().strip_prefix('"')?.strip_suffix('"')?;
            is_code(code).then_some(code)
        };
        let mut codes = Vec::new();
        for (call, argument) in [("bad_request(", 0), ("::new(", 1)] {
            for (at, _) in source.match_indices(call) {
                let arguments = &source[at + call.len()..];
                codes.extend(arguments.split([',', ')']).nth(argument).and_then(quoted));
            }
        }
        for (at, arm) in source.match_indices("=> \"") {
            let text = &source[at + arm.len()..];
            let code = &text[..text.find('"').unwrap_or(0)];
            if is_code(code) && code.contains('_') {
                codes.push(code);
            }
        }
        codes
    }

    #[test]
    fn every_code_the_api_answers_is_in_the_openapi_document() {
        let mut codes: Vec<&'static str> = every_engine_error()
            .into_iter()
            .map(|e| ApiError::from(e).code)
            .collect();
        codes.extend(every_auth_error().iter().map(AuthError::code));
        for source in [
            include_str!("error.rs"),
            include_str!("extract.rs"),
            include_str!("approvals.rs"),
            include_str!("runs.rs"),
            include_str!("dev.rs"),
            include_str!("slack.rs"),
            include_str!("mcp.rs"),
            include_str!("claude_code.rs"),
        ] {
            codes.extend(codes_written_in(source));
        }
        for expected in [
            "malformed_json",
            "no_route",
            "method_not_allowed",
            "dev_secret",
            "slack_signature",
            "slack_payload",
        ] {
            assert!(
                codes.contains(&expected),
                "{expected} was not read: {codes:?}"
            );
        }
        codes.sort();
        codes.dedup();
        let missing: Vec<_> = codes
            .iter()
            .filter(|code| !crate::api::OPENAPI_YAML.contains(&format!("`{code}`")))
            .collect();
        assert!(missing.is_empty(), "openapi.yaml does not name {missing:?}");
    }
}
