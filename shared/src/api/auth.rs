//! Who is calling: an [`Identity`] from authentication, never from the request body.
//!
//! Two sources implement [`Authenticate`]:
//! - [`BearerJwt`] verifies an HS256 bearer token itself (the local server, with a development
//!   key);
//! - [`GatewayClaims`] reads the claims API Gateway's JWT authorizer already verified, which the
//!   Lambda adapter hands over as a [`VerifiedClaims`] request extension.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::http::header;
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use jsonwebtoken::errors::ErrorKind as JwtErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::identity::Identity;
#[cfg(test)]
use crate::domain::identity::MAX_CLAIM_VALUE;
use crate::domain::ids::{PersonId, Role, TenantId};

/// Turns an authenticated request into the person acting. Implementations read only what
/// authentication established: headers they verify themselves, or extensions set by trusted code.
pub trait Authenticate: Send + Sync {
    fn identify(&self, request: &Parts) -> Result<Identity, AuthError>;
}

/// Why a request is not authenticated. Every variant is a 401.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token: send Authorization: Bearer <token>")]
    Missing,
    /// Two `Authorization` headers: which one counts would depend on who reads them.
    #[error("the request has more than one Authorization header: send exactly one")]
    Repeated,
    /// The token does not verify; the reason is one of this module's own sentences, never the
    /// JWT library's words.
    #[error("the bearer token is not valid: {0}")]
    Invalid(&'static str),
    #[error("the bearer token has expired")]
    Expired,
    /// The token's `nbf` (not before) is still in the future.
    #[error("the bearer token is not valid yet")]
    NotYetValid,
    /// Authentication succeeded, but its claims do not name a usable person, tenant or roles.
    #[error("the token's claims are not usable: {0}")]
    Claims(String),
}

impl AuthError {
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing_token",
            AuthError::Repeated => "repeated_authorization",
            AuthError::Invalid(_) => "invalid_token",
            AuthError::Expired => "token_expired",
            AuthError::NotYetValid => "token_not_yet_valid",
            AuthError::Claims(_) => "invalid_claims",
        }
    }
}

fn identity(subject: &str, tenant: &str, roles: BTreeSet<Role>) -> Result<Identity, AuthError> {
    Ok(Identity::new(
        TenantId::parse(tenant).map_err(|e| AuthError::Claims(e.to_string()))?,
        PersonId::parse(subject).map_err(|e| AuthError::Claims(e.to_string()))?,
        roles,
    ))
}

fn roles_of<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<BTreeSet<Role>, AuthError> {
    names
        .into_iter()
        .map(|name| Role::parse(name).map_err(|e| AuthError::Claims(e.to_string())))
        .collect()
}

/// The claims of a Countersign bearer token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    /// The person.
    pub sub: String,
    pub tenant: String,
    pub roles: Vec<String>,
    /// Expiry, in seconds since the epoch.
    pub exp: i64,
    pub iat: i64,
    pub iss: String,
    /// What else the token says of the person (the people file's `claims`), as policy rules
    /// read it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, String>,
}

/// A freshly issued bearer token and the identity it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IssuedToken {
    pub token: String,
    pub person: PersonId,
    pub tenant: TenantId,
    pub roles: BTreeSet<Role>,
    pub expires_at: DateTime<Utc>,
}

/// Verifies HS256 bearer tokens signed with a shared key, and issues them (the local mode's
/// `countersign token`).
pub struct BearerJwt {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

/// Why a key cannot sign or verify tokens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the token key is not usable: {0}")]
pub struct KeyError(String);

impl BearerJwt {
    /// The issuer every local token names, and the only one accepted.
    pub const ISSUER: &'static str = "countersign-local";
    /// Allowed clock difference when checking expiry.
    const LEEWAY_SECS: u64 = 5;

    /// A verifier and issuer for tokens signed with `key` (HS256; at least 32 bytes).
    pub fn hs256(key: &[u8]) -> Result<Self, KeyError> {
        if key.len() < 32 {
            return Err(KeyError(format!(
                "an HS256 key needs at least 32 bytes, this one has {}",
                key.len()
            )));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[Self::ISSUER]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        validation.leeway = Self::LEEWAY_SECS;
        // A token may say when it starts to count; one used before that is refused.
        validation.validate_nbf = true;
        Ok(Self {
            encoding: EncodingKey::from_secret(key).map_err(|e| KeyError(e.to_string()))?,
            decoding: DecodingKey::from_secret(key).map_err(|e| KeyError(e.to_string()))?,
            validation,
        })
    }

    /// A token for `who`, valid for `ttl` from `issued_at`.
    pub fn issue(
        &self,
        who: &Identity,
        issued_at: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<String, KeyError> {
        let ttl = chrono::Duration::from_std(ttl).map_err(|e| KeyError(e.to_string()))?;
        let claims = TokenClaims {
            sub: who.person.to_string(),
            tenant: who.tenant.to_string(),
            roles: who.roles.iter().map(|r| r.to_string()).collect(),
            exp: (issued_at + ttl).timestamp(),
            iat: issued_at.timestamp(),
            iss: Self::ISSUER.to_string(),
            claims: who.claims.clone(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|e| KeyError(e.to_string()))
    }

    /// A token for `who` with what it says about them, as `countersign token --json` prints it
    /// and the local server's development sign-in returns it.
    pub fn issue_for(
        &self,
        who: &Identity,
        issued_at: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<IssuedToken, KeyError> {
        let token = self.issue(who, issued_at, ttl)?;
        let ttl = chrono::Duration::from_std(ttl).map_err(|e| KeyError(e.to_string()))?;
        Ok(IssuedToken {
            token,
            person: who.person.clone(),
            tenant: who.tenant.clone(),
            roles: who.roles.clone(),
            expires_at: issued_at + ttl,
        })
    }

    /// The identity a token names, once its signature, issuer, expiry and start check out.
    pub fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        let data = jsonwebtoken::decode::<TokenClaims>(token, &self.decoding, &self.validation)
            .map_err(|error| {
                let refused = refusal(error.kind());
                // The library's own words stay in the log, where whoever runs the server reads them.
                tracing::debug!(%error, code = refused.code(), "bearer token refused");
                refused
            })?;
        let claims = data.claims;
        let roles = roles_of(claims.roles.iter().map(String::as_str))?;
        Ok(identity(&claims.sub, &claims.tenant, roles)?.with_claims(claims.claims))
    }
}

/// What a caller is told about a token that does not verify: a stable code and a plain
/// sentence, whatever the library found.
fn refusal(kind: &JwtErrorKind) -> AuthError {
    match kind {
        JwtErrorKind::ExpiredSignature => AuthError::Expired,
        JwtErrorKind::ImmatureSignature => AuthError::NotYetValid,
        JwtErrorKind::InvalidSignature => AuthError::Invalid("its signature does not match"),
        JwtErrorKind::InvalidIssuer => {
            AuthError::Invalid("it was not issued by this server (countersign-local)")
        }
        JwtErrorKind::InvalidAudience => AuthError::Invalid("it is meant for another audience"),
        JwtErrorKind::InvalidSubject => AuthError::Invalid("its subject is not accepted"),
        JwtErrorKind::InvalidAlgorithm
        | JwtErrorKind::InvalidAlgorithmName
        | JwtErrorKind::MissingAlgorithm => AuthError::Invalid("it is not signed with HS256"),
        JwtErrorKind::InvalidClaimFormat(_) => AuthError::Invalid("a claim has the wrong type"),
        JwtErrorKind::MissingRequiredClaim(_) => {
            AuthError::Invalid("it lacks a required claim (sub, exp, iss)")
        }
        JwtErrorKind::InvalidToken
        | JwtErrorKind::Base64(_)
        | JwtErrorKind::Json(_)
        | JwtErrorKind::Utf8(_) => AuthError::Invalid(
            "it is not a well-formed Countersign token (a signed JWT with sub, tenant, roles, exp and iss)",
        ),
        _ => AuthError::Invalid("it cannot be verified"),
    }
}

const BEARER_FORM: &str = "the Authorization header must be `Bearer <token>`";

impl Authenticate for BearerJwt {
    fn identify(&self, request: &Parts) -> Result<Identity, AuthError> {
        let mut values = request.headers.get_all(header::AUTHORIZATION).iter();
        let value = values.next().ok_or(AuthError::Missing)?;
        if values.next().is_some() {
            return Err(AuthError::Repeated);
        }
        let value = value
            .to_str()
            .map_err(|_| AuthError::Invalid("the Authorization header is not text"))?;
        let (scheme, token) = value
            .trim()
            .split_once(' ')
            .ok_or(AuthError::Invalid(BEARER_FORM))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Invalid(BEARER_FORM));
        }
        self.verify(token.trim())
    }
}

/// Claims that trusted code already verified, attached to the request as an extension.
///
/// The contract with the Lambda adapter: after API Gateway's JWT authorizer accepted the token,
/// the adapter copies `requestContext.authorizer.jwt.claims` into this map and inserts it into
/// the request's extensions before the router runs. API Gateway hands every claim over as a
/// string, so an array claim arrives flattened as `"[a b]"`; a claim may also arrive as a JSON
/// value. Nothing a client sends can set an extension, so the router trusts it; the function
/// must only be reachable through the authorizer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifiedClaims(pub BTreeMap<String, Value>);

impl VerifiedClaims {
    /// From the string map API Gateway passes to Lambda.
    pub fn from_strings<K: Into<String>, V: Into<String>>(
        claims: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self(
            claims
                .into_iter()
                .map(|(k, v)| (k.into(), Value::String(v.into())))
                .collect(),
        )
    }

    fn text(&self, name: &str) -> Result<&str, AuthError> {
        match self.0.get(name) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.trim()),
            Some(_) => Err(AuthError::Claims(format!("the {name} claim is not a name"))),
            None => Err(AuthError::Claims(format!("there is no {name} claim"))),
        }
    }
}

/// The claims every JWT may carry about itself rather than its person: never a rule's tag.
const REGISTERED_CLAIMS: [&str; 7] = ["iss", "sub", "aud", "exp", "nbf", "iat", "jti"];

/// Reads the identity from [`VerifiedClaims`]: the person, the tenant and the roles claims.
/// Their names are configurable because identity providers differ: the person may be `sub`
/// (the default), or `email` or `cognito:username` where `sub` is an opaque id; custom claims
/// are namespaced (`custom:tenant`, `cognito:groups`). None of them may be writable by the user
/// the token names (infra/README.md says which, per identity provider).
#[derive(Debug, Clone)]
pub struct GatewayClaims {
    person_claim: String,
    tenant_claim: String,
    roles_claim: String,
}

impl Default for GatewayClaims {
    fn default() -> Self {
        Self::new("tenant", "roles")
    }
}

impl GatewayClaims {
    /// The claim naming the person when none is configured: the token's subject.
    pub const PERSON_CLAIM: &'static str = "sub";

    pub fn new(tenant_claim: impl Into<String>, roles_claim: impl Into<String>) -> Self {
        Self {
            person_claim: Self::PERSON_CLAIM.into(),
            tenant_claim: tenant_claim.into(),
            roles_claim: roles_claim.into(),
        }
    }

    /// Names the person by another claim than `sub`, such as `email` or `cognito:username`.
    pub fn with_person_claim(mut self, person_claim: impl Into<String>) -> Self {
        self.person_claim = person_claim.into();
        self
    }

    pub fn identity_of(&self, claims: &VerifiedClaims) -> Result<Identity, AuthError> {
        let roles = match claims.0.get(&self.roles_claim) {
            Some(value) => parse_roles(value)?,
            None => BTreeSet::new(),
        };
        let named = [&self.person_claim, &self.tenant_claim, &self.roles_claim];
        // A token's other claims, as text: what policy rules read as the person's tags.
        let others = claims.0.iter().filter_map(|(name, value)| {
            let registered = REGISTERED_CLAIMS.contains(&name.as_str());
            if registered || named.contains(&name) {
                return None;
            }
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            Some((name.clone(), text))
        });
        Ok(identity(
            claims.text(&self.person_claim)?,
            claims.text(&self.tenant_claim)?,
            roles,
        )?
        .with_claims(others))
    }
}

impl Authenticate for GatewayClaims {
    fn identify(&self, request: &Parts) -> Result<Identity, AuthError> {
        let claims = request
            .extensions
            .get::<VerifiedClaims>()
            .ok_or(AuthError::Missing)?;
        self.identity_of(claims)
    }
}

/// Roles as a JSON array of strings, or as a string holding one: a JSON array in text
/// (`"[\"a\",\"b\"]"`) or API Gateway's flattening of an array claim (`"[a b]"`: names
/// separated by spaces). Nothing else: a bare or comma-separated string is refused, so a group
/// named `x,finance` is one (invalid) name and never grants `finance`.
pub fn parse_roles(value: &Value) -> Result<BTreeSet<Role>, AuthError> {
    match value {
        Value::Null => Ok(BTreeSet::new()),
        Value::Array(items) => {
            let names = items
                .iter()
                .map(|item| {
                    item.as_str()
                        .ok_or_else(|| AuthError::Claims("a role is not a string".into()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            roles_of(names)
        }
        Value::String(text) => {
            let text = text.trim();
            if let Ok(names) = serde_json::from_str::<Vec<String>>(text) {
                return roles_of(names.iter().map(String::as_str));
            }
            let flattened = text
                .strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .ok_or_else(|| {
                    AuthError::Claims(
                        "roles must be a JSON array, or API Gateway's flattened `[a b]`".into(),
                    )
                })?;
            roles_of(flattened.split_whitespace())
        }
        _ => Err(AuthError::Claims(
            "roles must be a JSON array, or API Gateway's flattened `[a b]`".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;
    use serde_json::json;

    fn names(roles: &BTreeSet<Role>) -> Vec<&str> {
        roles.iter().map(Role::as_str).collect()
    }

    fn parts_with(claims: Option<VerifiedClaims>, authorization: Option<&str>) -> Parts {
        let mut request = Request::builder().uri("/approvals");
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let mut request = request.body(()).unwrap();
        if let Some(claims) = claims {
            request.extensions_mut().insert(claims);
        }
        request.into_parts().0
    }

    #[test]
    fn roles_arrive_as_a_json_array() {
        let roles = parse_roles(&json!(["finance", "employee"])).unwrap();
        assert_eq!(names(&roles), ["employee", "finance"]);
    }

    #[test]
    fn roles_arrive_flattened_by_api_gateway() {
        let roles = parse_roles(&json!("[employee finance]")).unwrap();
        assert_eq!(names(&roles), ["employee", "finance"]);
        assert!(parse_roles(&json!("[]")).unwrap().is_empty());
        let one = parse_roles(&json!("[finance]")).unwrap();
        assert_eq!(names(&one), ["finance"]);
    }

    #[test]
    fn roles_arrive_as_json_text() {
        let roles = parse_roles(&json!(r#"["employee","finance"]"#)).unwrap();
        assert_eq!(names(&roles), ["employee", "finance"]);
    }

    #[test]
    fn a_group_named_with_a_comma_never_grants_the_role_after_it() {
        for claim in [
            json!("[x,finance]"),
            json!(["x,finance"]),
            json!(r#"["x,finance"]"#),
            json!("[employee x,finance]"),
            // A provider that sends the claim as JSON text keeps a space inside a name intact.
            json!(r#"["x finance"]"#),
        ] {
            let parsed = parse_roles(&claim);
            assert!(
                matches!(parsed, Err(AuthError::Claims(_))),
                "{claim}: {parsed:?}"
            );
        }
    }

    #[test]
    fn roles_as_bare_or_separated_names_are_refused() {
        for claim in [
            "finance",
            "employee,finance",
            "employee finance",
            "[finance",
        ] {
            assert!(
                matches!(parse_roles(&json!(claim)), Err(AuthError::Claims(_))),
                "{claim}"
            );
        }
    }

    #[test]
    fn a_role_that_is_not_a_name_is_refused() {
        assert!(matches!(
            parse_roles(&json!(["fin/ance"])),
            Err(AuthError::Claims(_))
        ));
        assert!(matches!(
            parse_roles(&json!([1, 2])),
            Err(AuthError::Claims(_))
        ));
        assert!(matches!(
            parse_roles(&json!({"a": 1})),
            Err(AuthError::Claims(_))
        ));
    }

    #[test]
    fn gateway_claims_become_an_identity() {
        let claims = VerifiedClaims::from_strings([
            ("sub", "dana"),
            ("tenant", "acme"),
            ("roles", "[employee finance]"),
            ("exp", "1900000000"),
        ]);
        let dana = GatewayClaims::default()
            .identify(&parts_with(Some(claims), None))
            .unwrap();
        assert_eq!(dana.person.as_str(), "dana");
        assert_eq!(dana.tenant.as_str(), "acme");
        assert!(dana.has_role(&Role::parse("finance").unwrap()));
    }

    #[test]
    fn gateway_claim_names_can_be_namespaced() {
        let claims = VerifiedClaims::from_strings([
            ("sub", "dana"),
            ("custom:tenant", "acme"),
            ("cognito:groups", "[finance]"),
        ]);
        let dana = GatewayClaims::new("custom:tenant", "cognito:groups")
            .identity_of(&claims)
            .unwrap();
        assert_eq!(names(&dana.roles), ["finance"]);
    }

    #[test]
    fn gateway_claims_without_a_tenant_or_at_all_are_refused() {
        let gateway = GatewayClaims::default();
        let no_tenant = VerifiedClaims::from_strings([("sub", "dana")]);
        assert!(matches!(
            gateway.identity_of(&no_tenant),
            Err(AuthError::Claims(_))
        ));
        assert_eq!(
            gateway.identify(&parts_with(None, Some("Bearer x"))),
            Err(AuthError::Missing),
            "a header is no substitute for verified claims"
        );
        let bad_subject = VerifiedClaims::from_strings([("sub", "da na"), ("tenant", "acme")]);
        assert!(matches!(
            gateway.identity_of(&bad_subject),
            Err(AuthError::Claims(_))
        ));
    }

    #[test]
    fn a_configured_person_claim_names_the_person_when_sub_is_opaque() {
        let claims = VerifiedClaims::from_strings([
            ("sub", "9f1c2a7e-0d4b-4e55-8c1a-3b2f6d7e8a90"),
            ("cognito:username", "ben"),
            ("custom:tenant", "acme"),
            ("cognito:groups", "[employee]"),
        ]);
        let gateway = GatewayClaims::new("custom:tenant", "cognito:groups")
            .with_person_claim("cognito:username");
        let ben = gateway.identity_of(&claims).unwrap();
        assert_eq!(ben.person.as_str(), "ben");
        let by_sub = GatewayClaims::new("custom:tenant", "cognito:groups")
            .identity_of(&claims)
            .unwrap();
        assert_eq!(
            by_sub.person.as_str(),
            "9f1c2a7e-0d4b-4e55-8c1a-3b2f6d7e8a90"
        );
        let missing = GatewayClaims::default().with_person_claim("email");
        assert!(matches!(
            missing.identity_of(&VerifiedClaims::from_strings([
                ("sub", "dana"),
                ("tenant", "acme")
            ])),
            Err(AuthError::Claims(_))
        ));
    }

    fn dana() -> Identity {
        identity("dana", "acme", roles_of(["employee", "finance"]).unwrap()).unwrap()
    }

    #[test]
    fn a_bearer_token_round_trips_to_the_same_identity() {
        let jwt = BearerJwt::hs256(&[7; 32]).unwrap();
        let token = jwt
            .issue(&dana(), Utc::now(), Duration::from_secs(600))
            .unwrap();
        let header = format!("Bearer {token}");
        assert_eq!(jwt.identify(&parts_with(None, Some(&header))), Ok(dana()));
        let with_claims = dana().with_claims([("department".into(), "finance".into())]);
        let token = jwt
            .issue(&with_claims, Utc::now(), Duration::from_secs(600))
            .unwrap();
        let header = format!("Bearer {token}");
        let read = jwt.identify(&parts_with(None, Some(&header))).unwrap();
        assert_eq!(read.claims["department"], "finance");
    }

    #[test]
    fn a_tokens_other_claims_are_the_persons_claims_the_registered_and_named_ones_are_not() {
        let mut claims = VerifiedClaims::from_strings([
            ("sub", "dana"),
            ("tenant", "acme"),
            ("roles", "[finance]"),
            ("exp", "1900000000"),
            ("iss", "https://idp.example"),
            ("department", "treasury"),
            ("long", &"x".repeat(MAX_CLAIM_VALUE + 1)),
        ]);
        claims.0.insert("level".into(), serde_json::json!(3));
        claims
            .0
            .insert("groups".into(), serde_json::json!(["a", "b"]));
        let dana = GatewayClaims::default().identity_of(&claims).unwrap();
        let names: Vec<&str> = dana.claims.keys().map(String::as_str).collect();
        assert_eq!(names, ["department", "level"]);
        assert_eq!(dana.claims["level"], "3");
    }

    #[test]
    fn bearer_tokens_that_do_not_verify_are_refused() {
        let jwt = BearerJwt::hs256(&[7; 32]).unwrap();
        let other = BearerJwt::hs256(&[8; 32]).unwrap();
        let foreign = other
            .issue(&dana(), Utc::now(), Duration::from_secs(600))
            .unwrap();
        assert!(matches!(jwt.verify(&foreign), Err(AuthError::Invalid(_))));
        let old = jwt
            .issue(
                &dana(),
                Utc::now() - chrono::Duration::hours(2),
                Duration::from_secs(3600),
            )
            .unwrap();
        assert_eq!(jwt.verify(&old), Err(AuthError::Expired));
        assert!(matches!(
            jwt.verify("not.a.token"),
            Err(AuthError::Invalid(_))
        ));
        assert_eq!(
            jwt.identify(&parts_with(None, None)),
            Err(AuthError::Missing)
        );
        assert!(matches!(
            jwt.identify(&parts_with(None, Some("Basic ZGFuYTp4"))),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn two_authorization_headers_are_refused_even_when_both_verify() {
        let jwt = BearerJwt::hs256(&[7; 32]).unwrap();
        let token = jwt
            .issue(&dana(), Utc::now(), Duration::from_secs(600))
            .unwrap();
        let mut request = Request::builder().uri("/approvals");
        for _ in 0..2 {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let parts = request.body(()).unwrap().into_parts().0;
        let refused = jwt.identify(&parts).unwrap_err();
        assert_eq!(refused, AuthError::Repeated);
        assert_eq!(refused.code(), "repeated_authorization");
    }

    #[test]
    fn a_token_from_another_issuer_is_refused() {
        let key = [7; 32];
        let claims = TokenClaims {
            sub: "dana".into(),
            tenant: "acme".into(),
            roles: vec!["finance".into()],
            exp: Utc::now().timestamp() + 600,
            iat: Utc::now().timestamp(),
            iss: "someone-else".into(),
            claims: Default::default(),
        };
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(&key).unwrap(),
        )
        .unwrap();
        let jwt = BearerJwt::hs256(&key).unwrap();
        assert!(matches!(jwt.verify(&token), Err(AuthError::Invalid(_))));
    }

    /// A token signed with `key` whose claims are exactly `claims`.
    fn signed(key: &[u8], claims: &Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(key).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_token_used_before_its_nbf_is_refused_and_one_after_it_counts() {
        let key = [7; 32];
        let jwt = BearerJwt::hs256(&key).unwrap();
        let now = Utc::now().timestamp();
        let claims = |nbf: i64| {
            json!({"sub": "dana", "tenant": "acme", "roles": ["employee", "finance"],
                   "iat": now, "exp": now + 3600, "iss": BearerJwt::ISSUER, "nbf": nbf})
        };
        let early = jwt.verify(&signed(&key, &claims(now + 600)));
        assert_eq!(early, Err(AuthError::NotYetValid));
        assert_eq!(early.unwrap_err().code(), "token_not_yet_valid");
        assert_eq!(jwt.verify(&signed(&key, &claims(now - 60))), Ok(dana()));
    }

    #[test]
    fn a_refused_token_is_told_in_plain_words_never_the_libraries() {
        let key = [7; 32];
        let jwt = BearerJwt::hs256(&key).unwrap();
        let now = Utc::now().timestamp();
        let base = json!({"sub": "dana", "tenant": "acme", "roles": ["finance"], "iat": now,
                          "exp": now + 3600, "iss": BearerJwt::ISSUER});
        let mut with_audience = base.clone();
        with_audience["aud"] = json!("someone-else");
        let mut no_tenant = base.clone();
        no_tenant.as_object_mut().unwrap().remove("tenant");
        // `{"alg":"none","typ":"JWT"}` in base64url, over real claims, without a signature.
        let claims_segment = signed(&key, &base).split('.').nth(1).unwrap().to_string();
        let alg_none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{claims_segment}.");
        let hs512 = jsonwebtoken::encode(
            &Header::new(Algorithm::HS512),
            &base,
            &EncodingKey::from_secret(&key).unwrap(),
        )
        .unwrap();
        for token in [
            alg_none,
            hs512,
            signed(&key, &with_audience),
            signed(&key, &no_tenant),
            "%%%.%%%.%%%".to_string(),
            "a.b".to_string(),
        ] {
            let refused = jwt.verify(&token).unwrap_err();
            let told = refused.to_string();
            for internal in [
                "variant",
                "Base64",
                "InvalidAudience",
                "Json",
                "missing field",
                "Error",
                "`",
            ] {
                assert!(!told.contains(internal), "{token}: {told}");
            }
            assert_eq!(refused.code(), "invalid_token", "{token}: {told}");
        }
    }

    #[test]
    fn a_short_key_is_refused() {
        assert!(BearerJwt::hs256(&[1; 16]).is_err());
    }
}
