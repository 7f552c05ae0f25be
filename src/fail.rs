//! How a command fails: a stable code, a sentence, and the exit status for it.

use shared::engine::{EngineError, ErrorKind};

#[derive(Debug)]
pub struct Failure {
    pub code: &'static str,
    pub message: String,
    /// 1 for a refusal or conflict, 2 for bad usage.
    pub exit: i32,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: "bad_usage",
            message: message.into(),
            exit: 2,
        }
    }
}

impl From<EngineError> for Failure {
    fn from(error: EngineError) -> Self {
        let exit = match error.kind() {
            ErrorKind::BadInput => 2,
            _ => 1,
        };
        Self {
            code: error.code(),
            message: error.to_string(),
            exit,
        }
    }
}

impl From<shared::domain::ids::IdError> for Failure {
    fn from(error: shared::domain::ids::IdError) -> Self {
        Self::usage(error.to_string())
    }
}
