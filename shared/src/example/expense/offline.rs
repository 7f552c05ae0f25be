//! A deterministic model that plays the expense agent, so everything runs without a network.
//! It reads the claim, the policy and similar claims, explains itself, then proposes `reimburse`
//! or `decline`, and reports what came of it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::domain::action::NotExecuted;
use crate::domain::conversation::{Block, Speaker, StopReason};
use crate::domain::money::Amount;
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest};

pub struct OfflineExpenseAgent;

/// The calls made so far and what each returned, by tool name (the latest of each).
struct Seen {
    results: BTreeMap<String, (Value, String, bool)>,
    turn: usize,
}

impl Seen {
    fn read(request: &ModelRequest<'_>) -> Self {
        let mut calls: BTreeMap<String, (String, Value)> = BTreeMap::new();
        let mut results = BTreeMap::new();
        let mut turn = 0;
        for message in request.messages {
            if message.role == Speaker::Assistant {
                turn += 1;
            }
            for block in &message.content {
                match block {
                    Block::ToolUse { id, name, input } => {
                        calls.insert(id.clone(), (name.clone(), input.clone()));
                    }
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } => {
                        if let Some((name, input)) = calls.get(tool_use_id) {
                            results
                                .insert(name.clone(), (input.clone(), content.clone(), *is_error));
                        }
                    }
                    Block::Text { .. } => {}
                }
            }
        }
        Self { results, turn }
    }

    /// A successful result, parsed.
    fn ok(&self, tool: &str) -> Option<Value> {
        self.results
            .get(tool)
            .filter(|(_, _, error)| !error)
            .and_then(|(_, content, _)| serde_json::from_str(content).ok())
    }

    fn raw(&self, tool: &str) -> Option<&(Value, String, bool)> {
        self.results.get(tool)
    }
}

fn claim_id_in(request: &ModelRequest<'_>) -> Option<String> {
    let first = request.messages.first()?;
    let text = first.text();
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'))
        .find(|w| w.starts_with("c-"))
        .map(str::to_string)
}

fn reply(turn: usize, text: String, calls: Vec<(&str, Value)>) -> ModelReply {
    let mut content = vec![Block::Text { text }];
    let stop_reason = if calls.is_empty() {
        StopReason::EndTurn
    } else {
        StopReason::ToolUse
    };
    for (n, (name, input)) in calls.into_iter().enumerate() {
        content.push(Block::ToolUse {
            id: format!("toolu_offline_{turn}_{n}"),
            name: name.into(),
            input,
        });
    }
    ModelReply {
        content,
        stop_reason,
        usage: None,
    }
}

fn money(cents: i64) -> String {
    Amount::from_cents(cents)
        .map(|a| a.to_string())
        .unwrap_or_else(|_| format!("{cents} cents"))
}

/// Proposes declining claim `id` for `reason`, saying `text`.
fn propose_decline(turn: usize, id: &str, text: String, reason: String) -> ModelReply {
    reply(
        turn,
        text,
        vec![("decline", json!({"claim_id": id, "reason": reason}))],
    )
}

/// The proposal once the agent has the claim, the limit and the similar claims.
fn decide(turn: usize, claim: &Value, limit: Option<&Value>, similar: &Value) -> ModelReply {
    let id = claim["id"].as_str().unwrap_or("?");
    let asked = claim["amount_cents"].as_i64().unwrap_or(0);
    let category = claim["category"].as_str().unwrap_or("?");
    let duplicate = similar["similar"].as_array().and_then(|list| {
        list.iter()
            .find(|c| c["status"].as_str().is_some_and(|s| s.starts_with("paid")))
    });
    if let Some(original) = duplicate {
        let original_id = original["id"].as_str().unwrap_or("?");
        let text = format!(
            "Claim {id} matches {original_id} (same employee, amount, date and merchant), which was already paid, so I propose declining it as a duplicate."
        );
        let reason = format!("Duplicate of {original_id}, which was already paid.");
        return propose_decline(turn, id, text, reason);
    }
    let Some(limit) = limit else {
        let text = format!(
            "Claim {id} is for {category}, which the expense policy does not cover, so I propose declining it."
        );
        let reason = format!("The expense policy does not cover {category}.");
        return propose_decline(turn, id, text, reason);
    };
    let per_night = limit["per"].as_str() == Some("night");
    let nights = claim["nights"].as_i64().unwrap_or(1).max(1);
    let cap = limit["limit_cents"].as_i64().unwrap_or(0) * if per_night { nights } else { 1 };
    let amount = asked.min(cap);
    let text = if amount < asked {
        let basis = if per_night {
            format!(
                "{} per night for {nights} night{}",
                money(limit["limit_cents"].as_i64().unwrap_or(0)),
                if nights == 1 { "" } else { "s" }
            )
        } else {
            format!("{} per claim", money(cap))
        };
        format!(
            "Claim {id} asks {} for {category}; the policy allows {basis}, so I propose reimbursing {}.",
            money(asked),
            money(amount)
        )
    } else {
        format!(
            "Claim {id} asks {} for {category}, within the {} limit, and no similar claim was paid, so I propose reimbursing it in full.",
            money(asked),
            money(cap)
        )
    };
    let note = if amount < asked {
        format!("Capped at the {category} limit.")
    } else {
        "Within policy.".into()
    };
    reply(
        turn,
        text,
        vec![(
            "reimburse",
            json!({"claim_id": id, "amount_cents": amount, "note": note}),
        )],
    )
}

/// The last word, once the proposal came back.
fn report(turn: usize, id: &str, tool: &str, seen: &Seen) -> ModelReply {
    let (_, content, is_error) = seen.raw(tool).expect("the decision came back");
    let text = if let Some(told) = NotExecuted::reason_in(content) {
        format!("Nothing was settled for claim {id}: {told}.")
    } else if *is_error {
        format!("Claim {id} could not be settled: {content}")
    } else {
        let result: Value = serde_json::from_str(content).unwrap_or(Value::Null);
        match (result["paid_cents"].as_i64(), result["reason"].as_str()) {
            (Some(cents), _) => format!("Reimbursed {} for claim {id}.", money(cents)),
            (None, Some(reason)) => format!("Declined claim {id}: {reason}"),
            _ => format!("Claim {id}: {content}"),
        }
    };
    reply(turn, text, vec![])
}

#[async_trait]
impl Model for OfflineExpenseAgent {
    fn name(&self) -> &str {
        "offline-expense-agent"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let seen = Seen::read(&request);
        let turn = seen.turn + 1;
        let Some(id) = claim_id_in(&request) else {
            return Ok(reply(
                turn,
                "I can only process a task that names an expense claim, like c-101.".into(),
                vec![],
            ));
        };
        if let Some(tool) = ["reimburse", "decline"]
            .into_iter()
            .find(|t| seen.raw(t).is_some())
        {
            return Ok(report(turn, &id, tool, &seen));
        }
        let Some((_, content, is_error)) = seen.raw("get_claim") else {
            return Ok(reply(
                turn,
                format!("I'll read claim {id}."),
                vec![("get_claim", json!({"claim_id": id}))],
            ));
        };
        if *is_error {
            return Ok(reply(
                turn,
                format!("I could not read claim {id}: {content}"),
                vec![],
            ));
        }
        let claim = seen.ok("get_claim").unwrap_or(Value::Null);
        let status = claim["status"].as_str().unwrap_or("open");
        if status != "open" {
            return Ok(reply(
                turn,
                format!("Claim {id} is already settled ({status}); there is nothing to do."),
                vec![],
            ));
        }
        let (Some(similar), true) = (
            seen.ok("find_similar_claims"),
            seen.raw("get_policy").is_some(),
        ) else {
            let category = claim["category"].as_str().unwrap_or_default();
            let text =
                format!("Claim {id} is {category}; I'll check its limit and look for duplicates.");
            let calls = vec![
                ("get_policy", json!({"category": category})),
                ("find_similar_claims", json!({"claim_id": id})),
            ];
            return Ok(reply(turn, text, calls));
        };
        Ok(decide(
            turn,
            &claim,
            seen.ok("get_policy").as_ref(),
            &similar,
        ))
    }
}
