//! Hosting the HTTP API in Lambda behind API Gateway's JWT authorizer.
//!
//! API Gateway verifies the token and hands its claims to the function in the request context;
//! [`with_gateway_claims`] copies them into the request as [`VerifiedClaims`], which
//! [`LambdaAuth`] reads. For local testing with `cargo lambda watch` there is no authorizer: if
//! `COUNTERSIGN_DEV_JWT_KEY_FILE` names a development key, bearer tokens signed with it (by
//! `countersign token`) are accepted instead. Never set it in a deployed stack.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::request::Parts;
use lambda_http::request::{LambdaRequest, RequestContext};
use lambda_http::tower::ServiceExt;
use lambda_http::{Adapter, Context, LambdaEvent, RequestExt};

use crate::api::{AuthError, Authenticate, BearerJwt, GatewayClaims, VerifiedClaims};
use crate::domain::identity::Identity;

/// Identity in Lambda: the authorizer's verified claims, or a development bearer token where
/// (and only where) a development key is configured.
pub struct LambdaAuth {
    gateway: GatewayClaims,
    development: Option<BearerJwt>,
}

impl LambdaAuth {
    pub fn new(gateway: GatewayClaims, development: Option<BearerJwt>) -> Self {
        Self {
            gateway,
            development,
        }
    }

    /// `COUNTERSIGN_PERSON_CLAIM`, `COUNTERSIGN_TENANT_CLAIM` and `COUNTERSIGN_ROLES_CLAIM`
    /// name the claims (default `sub`, `tenant` and `roles`); `COUNTERSIGN_DEV_JWT_KEY_FILE`
    /// enables development tokens.
    pub fn from_env() -> Result<Self, String> {
        Self::from_settings(|name| std::env::var(name).ok())
    }

    /// As [`LambdaAuth::from_env`], with the settings read through `setting`.
    pub fn from_settings(setting: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let claim = |name: &str, default: &str| {
            setting(name)
                .filter(|v| !v.is_empty())
                .unwrap_or(default.into())
        };
        let gateway = GatewayClaims::new(
            claim("COUNTERSIGN_TENANT_CLAIM", "tenant"),
            claim("COUNTERSIGN_ROLES_CLAIM", "roles"),
        )
        .with_person_claim(claim(
            "COUNTERSIGN_PERSON_CLAIM",
            GatewayClaims::PERSON_CLAIM,
        ));
        let development = match setting("COUNTERSIGN_DEV_JWT_KEY_FILE").filter(|v| !v.is_empty()) {
            Some(path) => Some(Self::development_key(Path::new(&path))?),
            None => None,
        };
        Ok(Self {
            gateway,
            development,
        })
    }

    fn development_key(path: &Path) -> Result<BearerJwt, String> {
        let key = std::fs::read(path)
            .map_err(|e| format!("cannot read the development key {}: {e}", path.display()))?;
        tracing::warn!(key = %path.display(), "accepting development bearer tokens: for local testing only");
        BearerJwt::hs256(&key).map_err(|e| e.to_string())
    }
}

impl Authenticate for LambdaAuth {
    fn identify(&self, request: &Parts) -> Result<Identity, AuthError> {
        match (
            &self.development,
            request.extensions.get::<VerifiedClaims>(),
        ) {
            (_, Some(claims)) => self.gateway.identity_of(claims),
            (Some(development), None) => development.identify(request),
            (None, None) => Err(AuthError::Missing),
        }
    }
}

/// The JWT authorizer's claims of a request that came through API Gateway, if any.
fn authorizer_claims(request: &Request) -> Option<VerifiedClaims> {
    match request.request_context_ref()? {
        RequestContext::ApiGatewayV2(context) => {
            let jwt = context.authorizer.as_ref()?.jwt.as_ref()?;
            Some(VerifiedClaims::from_strings(jwt.claims.clone()))
        }
        _ => None,
    }
}

/// The router, with each request's verified claims attached before any handler reads them.
pub fn with_gateway_claims(router: Router) -> Router {
    router.layer(axum::middleware::map_request(
        |mut request: Request| async move {
            if let Some(claims) = authorizer_claims(&request) {
                request.extensions_mut().insert(claims);
            }
            request
        },
    ))
}

/// Runs one API Gateway event (as JSON) through a router, as `lambda_http::run` does, and
/// returns the API Gateway response. For a function that takes other events too.
pub async fn invoke(
    router: Router,
    event: serde_json::Value,
    context: Context,
) -> Result<serde_json::Value, String> {
    let request: LambdaRequest =
        serde_json::from_value(event).map_err(|e| format!("not an API Gateway event: {e}"))?;
    let response = match Adapter::from(router)
        .oneshot(LambdaEvent::new(request, context))
        .await
    {
        Ok(response) => response,
        Err(never) => match never {},
    };
    serde_json::to_value(response).map_err(|e| e.to_string())
}

/// A shared authenticator, as the routers take it.
pub fn auth_from_env() -> Result<Arc<dyn Authenticate>, String> {
    Ok(Arc::new(LambdaAuth::from_env()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn request_with(claims: VerifiedClaims) -> Parts {
        let mut request = Request::builder().uri("/approvals").body(()).unwrap();
        request.extensions_mut().insert(claims);
        request.into_parts().0
    }

    #[test]
    fn a_deployment_that_names_the_person_claim_reads_the_person_from_it_not_from_an_opaque_sub() {
        let settings = [
            ("COUNTERSIGN_PERSON_CLAIM", "email"),
            ("COUNTERSIGN_TENANT_CLAIM", "custom:tenant"),
            ("COUNTERSIGN_ROLES_CLAIM", "cognito:groups"),
        ];
        let auth = LambdaAuth::from_settings(|name| {
            settings
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
        .unwrap();
        let claims = VerifiedClaims::from_strings([
            ("sub", "0b6c5f3e-7a21-4a9e-9d2f-58e1c0a4b7d3"),
            ("email", "ben@acme.example"),
            ("custom:tenant", "acme"),
            ("cognito:groups", "[employee]"),
        ]);
        let ben = auth.identify(&request_with(claims)).unwrap();
        assert_eq!(ben.person.as_str(), "ben@acme.example");

        let by_default = LambdaAuth::from_settings(|_| None).unwrap();
        let claims = VerifiedClaims::from_strings([
            ("sub", "dana"),
            ("email", "someone-else"),
            ("tenant", "acme"),
        ]);
        let dana = by_default.identify(&request_with(claims)).unwrap();
        assert_eq!(dana.person.as_str(), "dana");
    }
}
