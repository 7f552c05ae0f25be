//! `countersign hook claude-code`: Claude Code's command hook (docs/claude-code.md). It reads one
//! hook event's JSON on stdin and answers on stdout as Claude Code's hooks reference defines it,
//! through the logic `POST /hooks/claude-code/{agent}` shares ([`shared::api::claude_code`]).
//!
//! Every failure exits 2, which Claude Code takes as a blocking error (for `PreToolUse`, the
//! call does not run and stderr is fed back to Claude): a gate that cannot decide never allows.

use std::io::Read;

use serde_json::Value;
use shared::api::claude_code::{self, Event, HookError, MAX_EVENT_BYTES, Waiting};
use shared::api::waiting::WaitPlace;

use crate::Output;
use crate::cli::ClaudeCodeHook;
use crate::fail::Failure;
use crate::local::Local;

/// A hook failure: exit 2, so Claude Code blocks the call and shows Claude the message (main
/// exits 2 on any failure of a hook, these and the ones it shares with every command).
fn blocking(message: impl Into<String>) -> Failure {
    Failure {
        code: "hook",
        message: message.into(),
        exit: 2,
    }
}

/// Reads one hook event from `stdin`: bad JSON, a missing field or an event the hook does not
/// answer is refused before anything is stored.
pub fn read_event(stdin: impl Read) -> Result<Event, Failure> {
    let mut text = Vec::new();
    // One byte past the limit, to tell a larger input from one that ends there.
    stdin
        .take(MAX_EVENT_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|e| blocking(format!("cannot read the hook's input on stdin: {e}")))?;
    if text.len() > MAX_EVENT_BYTES {
        return Err(blocking(format!(
            "the hook's input has more than {MAX_EVENT_BYTES} bytes, the most it reads"
        )));
    }
    claude_code::read_event(&text).map_err(|e| blocking(e.to_string()))
}

/// Answers one event on stdout, or prints nothing where the hook has no answer.
pub async fn run(local: &Local, options: &ClaudeCodeHook, event: Event) -> Result<Output, Failure> {
    if let Some(answer) = answer(local, options, event).await? {
        println!("{answer}");
    }
    Ok(Output {
        text: String::new(),
        json: Value::Null,
    })
}

/// Answers one event: the JSON to print on stdout, or `None` for no output.
async fn answer(
    local: &Local,
    options: &ClaudeCodeHook,
    event: Event,
) -> Result<Option<Value>, Failure> {
    let who = local.identify(&options.person)?;
    let agent = crate::agent_named(&options.agent)?;
    local.loaded(&who.tenant, &agent)?;
    // One process, one call: no other request to keep room for.
    let waiting = Waiting {
        wait: options.wait,
        on_timeout: options.on_timeout,
        place: WaitPlace::default(),
    };
    claude_code::answer(&local.engine, &who, &agent, event, &waiting)
        .await
        .map_err(|e: HookError| blocking(e.to_string()))
}
