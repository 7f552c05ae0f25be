//! `countersign token`: development bearer tokens for the local server, signed with a key kept
//! in the state directory.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use shared::api::BearerJwt;

use crate::fail::Failure;
use crate::local::Local;

const KEY_FILE: &str = "dev-jwt.key";
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
    match std::fs::read(&path) {
        Ok(key) if key.len() == KEY_BYTES => return Ok(key),
        Ok(_) => {
            return Err(key_error(
                &path,
                format!("is not {KEY_BYTES} bytes; delete it to make a new one"),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(key_error(&path, e)),
    }
    std::fs::create_dir_all(state).map_err(|e| key_error(&path, e))?;
    let mut key = [0u8; KEY_BYTES];
    rand::fill(&mut key);
    // Written whole under a private name, then linked into place: a reader never sees half a
    // key, and a link that loses the race leaves the winner's key.
    let draft = draft_path(state);
    let written = write_private(&draft, &key).and_then(|()| std::fs::hard_link(&draft, &path));
    let _ = std::fs::remove_file(&draft);
    match written {
        Ok(()) => Ok(key.to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => dev_key(state),
        Err(e) => Err(key_error(&path, e)),
    }
}

fn draft_path(state: &Path) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    state.join(format!(".{KEY_FILE}.{}.{nanos}", std::process::id()))
}

fn write_private(path: &Path, key: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(key)?;
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
