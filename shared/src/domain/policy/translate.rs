//! The manifest's TOML rules, translated to Cedar at load: one way of deciding, not two. Each
//! rule keeps the name of its field (`tools.reimburse`, `hints.read_only`) as its id, so a
//! decision names it as the file does.

use super::cedar::literal;
use super::{Gate, ToolRule};

/// The Cedar rules for the TOML rule of `tool`.
pub fn tool_rule(tool: &str, rule: &ToolRule) -> String {
    let id = format!("tools.{tool}");
    let scope = format!("principal, action == Action::{}, resource", literal(tool));
    match rule {
        ToolRule::Allow => format!("@id({})\npermit({scope});\n", literal(&id)),
        ToolRule::Deny { reason } => format!(
            "@id({}) @reason({})\nforbid({scope});\n",
            literal(&id),
            literal(reason)
        ),
        ToolRule::Approve {
            gate: Gate::Always { quorum, reason },
            ..
        } => format!(
            "{}\npermit({scope});\n",
            approve(&id, rule, *quorum, reason)
        ),
        ToolRule::Approve {
            gate: Gate::AboveAmount { field, thresholds },
            ..
        } => {
            let amount = format!("context.input[{}]", literal(field));
            let cents = |t: &super::Threshold| t.above.cents();
            // At or below the lowest threshold, the call runs.
            let mut text = format!(
                "@id({})\npermit({scope}) when {{ {amount} <= {} }};\n",
                literal(&id),
                cents(&thresholds[0])
            );
            for (index, threshold) in thresholds.iter().enumerate() {
                let upper = thresholds
                    .get(index + 1)
                    .map(|next| format!(" && {amount} <= {}", cents(next)))
                    .unwrap_or_default();
                text.push_str(&format!(
                    "{}\npermit({scope}) when {{ {amount} > {}{upper} }};\n",
                    approve(
                        &format!("{id}.thresholds[{index}]"),
                        rule,
                        threshold.quorum,
                        &threshold.reason
                    ),
                    cents(threshold)
                ));
            }
            // An amount that is not a whole number of cents at or above zero is refused.
            text.push_str(&format!(
                "@id({}) @reason({})\nforbid({scope}) unless {{ context.input has {} && {amount} >= 0 }};\n",
                literal(&format!("{id}.amount_field")),
                literal(&format!("{tool} needs {field} as a whole number of cents")),
                literal(field),
            ));
            text
        }
    }
}

/// The Cedar rules for a `[hints.*]` rule: tools no TOML rule names, by what they say of
/// themselves. A tool that says both is destructive.
pub fn hint_rule(hint: &str, rule: &ToolRule, named: &[&String]) -> String {
    let id = format!("hints.{hint}");
    let when = match hint {
        "destructive" => "context.hints.destructive",
        _ => "context.hints.read_only && !context.hints.destructive",
    };
    let unless = match named.is_empty() {
        true => String::new(),
        false => format!(
            " unless {{ action in [{}] }}",
            named
                .iter()
                .map(|tool| format!("Action::{}", literal(tool)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let body = format!("(principal, action, resource) when {{ {when} }}{unless};\n");
    match rule {
        ToolRule::Allow => format!("@id({})\npermit{body}", literal(&id)),
        ToolRule::Deny { reason } => format!(
            "@id({}) @reason({})\nforbid{body}",
            literal(&id),
            literal(reason)
        ),
        ToolRule::Approve {
            gate: Gate::Always { quorum, reason },
            ..
        } => format!("{}\npermit{body}", approve(&id, rule, *quorum, reason)),
        // An amount names one tool's argument: a hint rule cannot gate on one.
        ToolRule::Approve { .. } => String::new(),
    }
}

/// The annotations of an approval rule.
fn approve(id: &str, rule: &ToolRule, quorum: u8, reason: &str) -> String {
    let ToolRule::Approve {
        approver_role,
        ttl,
        escalate,
        ..
    } = rule
    else {
        unreachable!("an approval rule")
    };
    let mut text = format!(
        "@id({}) @approve({}) @quorum(\"{quorum}\") @reason({})",
        literal(id),
        literal(approver_role.as_str()),
        literal(reason)
    );
    if let Some(ttl) = ttl {
        text.push_str(&format!(" @ttl(\"{}s\")", ttl.as_secs()));
    }
    if !escalate.is_empty() {
        let steps: Vec<String> = escalate
            .iter()
            .map(|step| format!("{}s {}", step.after.as_secs(), step.to))
            .collect();
        text.push_str(&format!(" @escalate({})", literal(&steps.join(", "))));
    }
    text
}
