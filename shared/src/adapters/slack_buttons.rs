//! The Approve, Reject and Edit buttons a notice carries for a Slack app: their choices and
//! action ids, and the block that renders them. Both notifiers render them (webhooks and the
//! Slack channel); the Slack app reads a click back (`slack::Button`).

use serde_json::{Value, json};

use crate::domain::approval::{Approval, ApprovalKind};

/// The buttons' action ids start with this, then the choice, the approval and its version.
pub(super) const ACTION_PREFIX: &str = "countersign.";

/// A button's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ButtonChoice {
    Approve,
    Reject,
    /// Opens a form for a lower amount; its submission is the edit.
    Edit,
}

impl ButtonChoice {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            ButtonChoice::Approve => "approve",
            ButtonChoice::Reject => "reject",
            ButtonChoice::Edit => "edit",
        }
    }
}

/// The action id of a button: `countersign.<choice>.<approval>.v<version>`. The same on every
/// notice of one approval version, so a click on the notice and one on its reminder by the same
/// person are one decision.
pub fn action_id(choice: ButtonChoice, approval: &Approval) -> String {
    format!(
        "{ACTION_PREFIX}{}.{}.v{}",
        choice.as_str(),
        approval.id,
        approval.action_version
    )
}

/// The Approve and Reject buttons of a notice (and Edit, where policy lets a reviewer lower the
/// amount), bound to the version and args hash shown. A recovery (did a call take effect?)
/// gets none: it is answered on the review page.
pub fn buttons(approval: &Approval, editable: bool) -> Option<Value> {
    if approval.kind != ApprovalKind::Action {
        return None;
    }
    let value = json!({
        "approval": approval.id,
        "version": approval.action_version,
        "args_hash": approval.args_hash,
    })
    .to_string();
    let version = approval.action_version;
    let edit = editable.then(|| {
        json!({
            "type": "button",
            "action_id": action_id(ButtonChoice::Edit, approval),
            "text": {"type": "plain_text", "text": format!("Edit version {version}")},
            "value": value,
        })
    });
    let mut block = json!({
        "type": "actions",
        "block_id": "countersign.decide",
        "elements": [
            {
                "type": "button",
                "action_id": action_id(ButtonChoice::Approve, approval),
                "text": {"type": "plain_text", "text": format!("Approve version {version}")},
                "style": "primary",
                "value": value,
            },
            {
                "type": "button",
                "action_id": action_id(ButtonChoice::Reject, approval),
                "text": {"type": "plain_text", "text": format!("Reject version {version}")},
                "style": "danger",
                "value": value,
                "confirm": {
                    "title": {"type": "plain_text", "text": "Reject this call?"},
                    "text": {"type": "plain_text", "text": "The agent is told it was rejected in Slack and must not retry it. To give a reason, reject it on the review page."},
                    "confirm": {"type": "plain_text", "text": "Reject"},
                    "deny": {"type": "plain_text", "text": "Cancel"},
                },
            },
        ],
    });
    if let (Some(edit), Some(elements)) = (edit, block["elements"].as_array_mut()) {
        elements.insert(1, edit);
    }
    Some(block)
}
