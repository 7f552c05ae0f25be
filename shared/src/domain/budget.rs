//! What each stored record may hold, so that none can pass DynamoDB's 400 KB item (names and
//! values counted), on either store. The engine keeps every piece of a record within its share
//! here; the stores refuse anything past [`ITEM_LIMIT`] as a last line, never as the rule.
//!
//! The shares, and the records they bound (each well under the limit at its worst):
//! - a proposed call's arguments, [`ARGS`], and all the calls one reply proposes, [`TURN_ARGS`]:
//!   over either, the call is answered "too large" and nothing is proposed to a person;
//! - a reply's text, [`REPLY_TEXT`] (the explanation every call of the reply carries), and a
//!   tool result, [`RESULT`]: over either, the text is stored cut, with a note of what was cut,
//!   which the model reads too;
//! - an approval's comments together, [`COMMENTS`].
//!
//! So an action (arguments, explanation, result) stays under 100 KiB, an approval (arguments,
//! the previous version's, explanation, comments, decisions) under 350 KiB, a turn's results
//! under 300 KiB; a transaction's audit events and messages are split over as many audit items
//! as they need, each within [`AUDIT_ITEM`].

use std::fmt;

use serde_json::json;
use sha2::{Digest, Sha256};

use super::args::canonical;
use super::conversation::{Block, McpResult};

/// The largest item either store keeps: DynamoDB's 400 KB item, attribute names and values,
/// read as 400,000 bytes. DynamoDB itself takes a little more (409,600), the local stack less
/// (405,000): an item within this is taken by both.
pub const ITEM_LIMIT: usize = 400_000;
/// One proposed call's arguments, as canonical JSON.
pub const ARGS: usize = 32 * 1024;
/// All the calls of one model reply, their canonical arguments together.
pub const TURN_ARGS: usize = 64 * 1024;
/// The text of one model reply.
pub const REPLY_TEXT: usize = 16 * 1024;
/// One tool result, as stored and told to the model.
pub const RESULT: usize = 32 * 1024;
/// An approval's comments, their texts together.
pub const COMMENTS: usize = 224 * 1024;
/// What one audit item holds at most: a transaction's events and messages past it go on in
/// the next audit item of the same transaction.
pub const AUDIT_ITEM: usize = 320 * 1024;

/// A size in the units a person reads: bytes below 1 KiB, else KiB with one decimal where
/// it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub usize);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n < 1024 {
            write!(f, "{n} bytes")
        } else if n.is_multiple_of(1024) || n >= 100 * 1024 {
            write!(f, "{} KiB", n.div_ceil(1024))
        } else {
            write!(f, "{:.1} KiB", n as f64 / 1024.0)
        }
    }
}

/// A text kept within `max` bytes: cut at a character boundary, with a note saying what was
/// cut, how long the whole was, and its SHA-256, so the whole can still be recognised. `None`
/// if it fits as it is.
pub fn cut(text: &str, max: usize, what: &str) -> Option<String> {
    if text.len() <= max {
        return None;
    }
    let note = cut_note(what, max, text.len(), Some(text));
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(format!("{}{note}", &text[..end]))
}

fn cut_note(what: &str, kept: usize, whole: usize, text: Option<&str>) -> String {
    let hash = text
        .map(|t| format!(", sha256:{}", hex::encode(Sha256::digest(t.as_bytes()))))
        .unwrap_or_default();
    format!(
        "\n[Countersign kept the first {} of this {what}, which was {}{hash}: the rest was cut for storage.]",
        Size(kept),
        Size(whole)
    )
}

/// A tool result's text with an MCP server's blocks and structured content beside it, made fit
/// to store: all of it within [`RESULT`]. Whatever does not fit beside the whole text is left
/// out, the blocks before the structured content, and the text ends saying what was left out
/// and how large it was; a text past its share is cut as [`cut`] cuts it. `None` when nothing
/// is left beside the text.
pub fn fit_result(text: String, mut mcp: McpResult) -> (String, Option<McpResult>) {
    let mut left_out = Vec::new();
    if text.len() + json_len(&mcp.content) > RESULT {
        left_out.push(format!(
            "its content blocks ({})",
            Size(json_len(&mcp.content))
        ));
        mcp.content = None;
    }
    let beside = |mcp: &McpResult| json_len(&mcp.content) + json_len(&mcp.structured_content);
    if text.len() + beside(&mcp) > RESULT {
        left_out.push(format!(
            "its structured content ({})",
            Size(json_len(&mcp.structured_content))
        ));
        mcp.structured_content = None;
    }
    let text = match left_out.is_empty() {
        true => cut(&text, RESULT, "result").unwrap_or(text),
        false => {
            let note = format!(
                "\n[Countersign kept the text of this result and left out {}: a stored result is at most {}.]",
                left_out.join(" and "),
                Size(RESULT)
            );
            let share = RESULT - beside(&mcp) - note.len();
            let kept = cut(&text, share, "result").unwrap_or(text);
            format!("{kept}{note}")
        }
    };
    let kept = mcp.content.is_some() || mcp.structured_content.is_some();
    (text, kept.then_some(mcp))
}

/// The length of `value` as JSON; nothing is 0.
fn json_len<T: serde::Serialize>(value: &Option<T>) -> usize {
    value
        .as_ref()
        .and_then(|v| serde_json::to_string(v).ok())
        .map_or(0, |json| json.len())
}

/// The answer for arguments of `len` bytes past `max`: `None` if they fit.
pub fn too_large(len: usize, max: usize) -> Option<String> {
    (len > max).then(|| {
        format!(
            "the arguments are too large: {} of JSON, at most {}",
            Size(len),
            Size(max)
        )
    })
}

/// A model reply made fit to store, in place: its text within [`REPLY_TEXT`] (cut, with a
/// note the model reads on its next turn), and each call's arguments within [`ARGS`] and what
/// is left of [`TURN_ARGS`] after the calls before it. A call past either keeps its id and name
/// but not its arguments; it comes back with why, by its id, to be answered without running.
pub fn fit_reply(content: &mut [Block]) -> Vec<(String, String)> {
    let text_len: usize = content
        .iter()
        .map(|b| match b {
            Block::Text { text } => text.len(),
            _ => 0,
        })
        .sum();
    if text_len > REPLY_TEXT {
        let mut left = REPLY_TEXT;
        let note = cut_note("reply", REPLY_TEXT, text_len, None);
        let mut noted = false;
        for block in content.iter_mut() {
            let Block::Text { text } = block else {
                continue;
            };
            if text.len() <= left.saturating_sub(note.len()) {
                left -= text.len();
                continue;
            }
            let mut end = left.saturating_sub(note.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            if !noted {
                text.push_str(&note);
                noted = true;
            }
            left = 0;
        }
    }
    let mut oversized = Vec::new();
    let mut turn = 0;
    for block in content.iter_mut() {
        let Block::ToolUse { id, input, .. } = block else {
            continue;
        };
        let len = canonical(input).len();
        let room = ARGS.min(TURN_ARGS - turn);
        let Some(why) = too_large(len, room) else {
            turn += len;
            continue;
        };
        let why = match room < ARGS {
            true => format!(
                "{why} left of the {} one reply's calls may carry together",
                Size(TURN_ARGS)
            ),
            false => why,
        };
        *input = json!({ "countersign": format!("not stored: {why}") });
        oversized.push((id.clone(), why));
    }
    oversized
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn a_text_within_its_share_is_kept_whole() {
        assert_eq!(cut("short", 10, "reply"), None);
        assert_eq!(cut(&"a".repeat(RESULT), RESULT, "result"), None);
    }

    #[test]
    fn a_cut_text_fits_its_share_and_says_what_was_cut_how_long_and_its_hash() {
        let long = "é".repeat(40_000);
        let kept = cut(&long, RESULT, "result").unwrap();
        assert!(kept.len() <= RESULT, "{}", kept.len());
        assert!(kept.starts_with("éé"));
        let hash = hex::encode(Sha256::digest(long.as_bytes()));
        assert!(
            kept.ends_with(&format!(
                "[Countersign kept the first 32 KiB of this result, which was 78.1 KiB, sha256:{hash}: the rest was cut for storage.]"
            )),
            "{}",
            &kept[kept.len() - 200..]
        );
    }

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(Size(900).to_string(), "900 bytes");
        assert_eq!(Size(32 * 1024).to_string(), "32 KiB");
        assert_eq!(Size(1536).to_string(), "1.5 KiB");
        assert_eq!(Size(450_000).to_string(), "440 KiB");
    }

    #[test]
    fn arguments_past_their_share_are_answered_with_both_sizes() {
        assert_eq!(too_large(ARGS, ARGS), None);
        assert_eq!(
            too_large(450_000, ARGS).unwrap(),
            "the arguments are too large: 440 KiB of JSON, at most 32 KiB"
        );
    }

    fn call(id: &str, input: Value) -> Block {
        Block::ToolUse {
            id: id.into(),
            name: "write_document".into(),
            input,
        }
    }

    #[test]
    fn a_reply_within_its_shares_is_kept_as_it_is() {
        let mut reply = vec![
            Block::Text {
                text: "I will write it.".into(),
            },
            call("t1", json!({"body": "short"})),
        ];
        let before = reply.clone();
        assert!(fit_reply(&mut reply).is_empty());
        assert_eq!(reply, before);
    }

    #[test]
    fn a_long_reply_is_cut_with_a_note_and_a_call_past_its_share_keeps_no_arguments() {
        let mut reply = vec![
            Block::Text {
                text: "w".repeat(20 * 1024),
            },
            call("t1", json!({"body": "x".repeat(40 * 1024)})),
            call("t2", json!({"body": "y".repeat(31 * 1024)})),
            call("t3", json!({"body": "z".repeat(31 * 1024)})),
            call("t4", json!({"body": "v".repeat(3 * 1024)})),
            call("t5", json!({"body": "small"})),
        ];
        let oversized = fit_reply(&mut reply);
        let Block::Text { text } = &reply[0] else {
            panic!("text first")
        };
        assert!(text.len() <= REPLY_TEXT);
        assert!(
            text.ends_with("which was 20 KiB: the rest was cut for storage.]"),
            "{text}"
        );
        let ids: Vec<&str> = oversized.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["t1", "t4"], "t4 would pass the turn's share; t5 fits");
        assert!(
            oversized[0].1.ends_with("at most 32 KiB"),
            "{}",
            oversized[0].1
        );
        assert!(
            oversized[1]
                .1
                .ends_with("left of the 64 KiB one reply's calls may carry together"),
            "{}",
            oversized[1].1
        );
        let Block::ToolUse { input, .. } = &reply[1] else {
            panic!("a call")
        };
        assert!(
            input["countersign"]
                .as_str()
                .unwrap()
                .starts_with("not stored: ")
        );
        assert!(matches!(&reply[5], Block::ToolUse { input, .. } if input["body"] == "small"));
    }
}
