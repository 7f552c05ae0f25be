//! `countersign token`: development bearer tokens for the local server, signed with a key kept
//! in the state directory; and the secret the local server's development sign-in asks for.
//! Both files are the state owner's only (0600).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use shared::api::BearerJwt;

use crate::fail::Failure;
use crate::local::Local;

const KEY_FILE: &str = "dev-jwt.key";
/// Where development sign-in's secret lives in the state directory.
pub const SECRET_FILE: &str = "dev-sign-in.secret";
const KEY_BYTES: usize = 32;
/// How long a token from the review page's development sign-in lives, as `countersign token`'s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(12 * 3600);
/// Development tokens are short-lived; a longer one is refused.
const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

fn key_error(path: &Path, error: impl std::fmt::Display) -> Failure {
    Failure {
        code: "dev_key",
        message: format!("the development key {}: {error}", path.display()),
        exit: 1,
    }
}

/// The development signing key: `<state>/dev-jwt.key`, 32 random bytes, created on first use
/// with mode 0600. Two processes creating it at once agree on one key.
pub fn dev_key(state: &Path) -> Result<Vec<u8>, Failure> {
    let path = state.join(KEY_FILE);
    let key = private_secret(state, KEY_FILE, || {
        let mut key = [0u8; KEY_BYTES];
        rand::fill(&mut key);
        key.to_vec()
    })
    .map_err(|e| key_error(&path, e))?;
    if key.len() != KEY_BYTES {
        return Err(key_error(
            &path,
            format!("is not {KEY_BYTES} bytes; delete it to make a new one"),
        ));
    }
    Ok(key)
}

/// The secret development sign-in asks for: `<state>/dev-sign-in.secret`, 64 hex digits,
/// created on first use with mode 0600, so only the state's owner can read it.
pub fn dev_sign_in_secret(state: &Path) -> Result<String, Failure> {
    let path = state.join(SECRET_FILE);
    let secret = private_secret(state, SECRET_FILE, || {
        let mut bytes = [0u8; KEY_BYTES];
        rand::fill(&mut bytes);
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into_bytes()
    })
    .map_err(|e| key_error(&path, e))?;
    match String::from_utf8(secret) {
        Ok(text) if text.trim().len() >= 32 => Ok(text.trim().to_string()),
        _ => Err(key_error(
            &path,
            "is not a secret of at least 32 characters; delete it to make a new one",
        )),
    }
}

/// The content of `<state>/<name>`, made by `make` and written with mode 0600 if it is absent.
fn private_secret(
    state: &Path,
    name: &str,
    make: impl Fn() -> Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    let path = state.join(name);
    match std::fs::read(&path) {
        Ok(content) => return Ok(content),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    shared::adapters::state_dir::create(state)?;
    let content = make();
    // Written whole under a private name, then linked into place: a reader never sees half a
    // secret, and a link that loses the race leaves the winner's.
    let draft = draft_path(state, name);
    let written = write_private(&draft, &content).and_then(|()| std::fs::hard_link(&draft, &path));
    let _ = std::fs::remove_file(&draft);
    match written {
        Ok(()) => Ok(content),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::read(&path),
        Err(e) => Err(e),
    }
}

fn draft_path(state: &Path, name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    state.join(format!(".{name}.{}.{nanos}", std::process::id()))
}

fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(content)?;
    file.sync_all()
}

/// A token for a person of the people directory, with their tenant and roles.
pub fn issue(local: &Local, state: &Path, person: &str, ttl: Duration) -> Result<Value, Failure> {
    if ttl > MAX_TTL {
        return Err(Failure::usage("a development token lives at most 30 days"));
    }
    let who = local.identify(person)?;
    let key = dev_key(state)?;
    let path = state.join(KEY_FILE);
    let jwt = BearerJwt::hs256(&key).map_err(|e| key_error(&path, e))?;
    let issued = jwt
        .issue_for(&who, chrono::Utc::now(), ttl)
        .map_err(|e| key_error(&path, e))?;
    Ok(serde_json::to_value(issued).expect("an issued token serializes"))
}
