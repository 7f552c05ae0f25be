//! An approval's item: its stored form, and the marker that puts it in the escalation index.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::keys;
use crate::domain::approval::{
    Approval, ApprovalKind, ApprovalStatus, Choice, Comment, Decision, DecisionEffect,
    PreviousVersion, is_plain,
};
use crate::domain::args::{Args, ArgsHash};
use crate::domain::audit::LogSlot;
use crate::domain::ids::{
    ActionId, ActionVersion, AgentName, ApprovalId, DecisionId, PersonId, Role, RunId, TenantId,
};
use crate::domain::policy::{Escalation, ToolHints};
use crate::ports::store::Item;

/// An approval's fields its item leaves out when they are the approval's own: each decision's
/// version and arguments' hash (a decision is about the version the approval asks for).
const DECISION_OWN: [&str; 2] = ["action_version", "args_hash"];
/// An approval's fields its partition key names.
const APPROVAL_KEYED: [&str; 2] = ["id", "tenant"];
/// When an approval was resolved: left out where its last decision resolved it.
const RESOLVED_AT: &str = "resolved_at";

/// The body of an approval's item: the approval's JSON (as the API shows it) less what the
/// item need not repeat, so a decided approval stays one write unit (1 KB) on DynamoDB:
/// - `id` and `tenant`, which its partition key names;
/// - fields that are unset (`null`: `previous`, `superseded_by`, `resolved_at` and
///   `reminded_at` until they are set), which read back as unset;
/// - a decision's `action_version` and `args_hash` where they are the approval's own (always,
///   as [`Approval::decide`] records them; kept where they differ);
/// - its `args_hash` where it is the hash of its own agent, tool and arguments;
/// - `resolved_at` where the last decision resolved it (its `at`): a resolved approval always
///   has a `resolved_at`, so one that reads back without it takes its last decision's.
///
/// [`decode`] fills them back. The `decision` events are the decisions themselves, each with
/// where it sits in the run's log ([`held_by_approval`]).
///
/// [`decode`]: super::decode
/// [`held_by_approval`]: super::held_by_approval
pub(super) fn approval_body(approval: &Approval) -> String {
    debug_assert!(
        approval.status == ApprovalStatus::AwaitingApproval || approval.resolved_at.is_some(),
        "a resolved approval says when"
    );
    serde_json::to_string(&StoredApproval::of(approval)).expect("engine records serialize")
}

/// An approval as its item holds it ([`approval_body`]), serialized straight from the approval:
/// every field but the ones left out, in the approval's order.
#[derive(Serialize)]
struct StoredApproval<'a> {
    agent: &'a AgentName,
    kind: &'a ApprovalKind,
    run_id: &'a RunId,
    action_id: &'a ActionId,
    action_version: &'a ActionVersion,
    tool_use_id: &'a str,
    tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    hints: Option<&'a ToolHints>,
    args: &'a Args,
    #[serde(skip_serializing_if = "Option::is_none")]
    args_hash: Option<&'a ArgsHash>,
    explanation: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<&'a PreviousVersion>,
    reason: &'a str,
    approver_role: &'a Role,
    quorum: u8,
    requested_by: &'a [PersonId],
    policy_version: u32,
    created_at: &'a DateTime<Utc>,
    expires_at: &'a DateTime<Utc>,
    status: &'a ApprovalStatus,
    decisions: Vec<StoredDecision<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    superseded_by: Option<&'a ApprovalId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resolved_at: Option<&'a DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reminded_at: Option<&'a DateTime<Utc>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    comments: &'a [Comment],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    escalate: &'a [Escalation],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    escalated_to: &'a [Role],
}

/// A decision as its approval's item holds it: its version and hash only where they are not
/// the approval's own.
#[derive(Serialize)]
struct StoredDecision<'a> {
    decision_id: &'a DecisionId,
    by: &'a PersonId,
    #[serde(flatten)]
    choice: &'a Choice,
    #[serde(skip_serializing_if = "Option::is_none")]
    action_version: Option<&'a ActionVersion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args_hash: Option<&'a ArgsHash>,
    at: &'a DateTime<Utc>,
    effect: &'a DecisionEffect,
    #[serde(skip_serializing_if = "Option::is_none")]
    logged: Option<&'a LogSlot>,
}

impl<'a> StoredApproval<'a> {
    fn of(approval: &'a Approval) -> Self {
        // Every field named: one added to `Approval` fails to compile here until it is stored.
        let Approval {
            id: _,
            tenant: _,
            agent,
            kind,
            run_id,
            action_id,
            action_version,
            tool_use_id,
            tool,
            hints,
            args,
            args_hash,
            explanation,
            previous,
            reason,
            approver_role,
            quorum,
            requested_by,
            policy_version,
            created_at,
            expires_at,
            status,
            decisions,
            superseded_by,
            resolved_at,
            reminded_at,
            comments,
            escalate,
            escalated_to,
        } = approval;
        let last_at = decisions.last().map(|d| &d.at);
        let decisions = decisions
            .iter()
            .map(|decision| {
                let Decision {
                    decision_id,
                    by,
                    choice,
                    action_version: version,
                    args_hash: hash,
                    at,
                    effect,
                    logged,
                } = decision;
                StoredDecision {
                    decision_id,
                    by,
                    choice,
                    action_version: (version != action_version).then_some(version),
                    args_hash: (hash != args_hash).then_some(hash),
                    at,
                    effect,
                    logged: logged.as_ref(),
                }
            })
            .collect();
        let own_hash = *args_hash == ArgsHash::of_call(agent, tool, args);
        Self {
            agent,
            kind,
            run_id,
            action_id,
            action_version,
            tool_use_id,
            tool,
            hints: (!is_plain(hints)).then_some(hints),
            args,
            args_hash: (!own_hash).then_some(args_hash),
            explanation,
            previous: previous.as_ref(),
            reason,
            approver_role,
            quorum: *quorum,
            requested_by,
            policy_version: *policy_version,
            created_at,
            expires_at,
            status,
            decisions,
            superseded_by: superseded_by.as_ref(),
            resolved_at: resolved_at.as_ref().filter(|at| Some(*at) != last_at),
            reminded_at: reminded_at.as_ref(),
            comments,
            escalate,
            escalated_to,
        }
    }
}

/// An approval's hash, left out of its item where it is the one its agent, tool and arguments
/// give (every approval made since the hash covered them), and made again from them on reading.
const ARGS_HASH: &str = "args_hash";

/// The hash an approval's JSON without one stands for: its agent's, tool's and arguments'.
fn own_hash(fields: &serde_json::Map<String, serde_json::Value>) -> Result<String, String> {
    let agent: AgentName = serde_json::from_value(fields.get("agent").cloned().unwrap_or_default())
        .map_err(|e| format!("agent: {e}"))?;
    let tool = fields
        .get("tool")
        .and_then(|t| t.as_str())
        .ok_or("no tool")?;
    let args: Args = serde_json::from_value(fields.get("args").cloned().unwrap_or_default())
        .map_err(|e| format!("args: {e}"))?;
    Ok(ArgsHash::of_call(&agent, tool, &args).as_str().to_string())
}

/// An approval's JSON from its item ([`approval_body`]), the fields left out filled back: its
/// id and tenant from the item's key, its decisions' version and hash from its own. A field the
/// body holds is kept as it is.
pub(super) fn approval_value(item: &Item) -> Result<serde_json::Value, String> {
    let (tenant, id) = keys::approval_of(&item.pk).ok_or("not an approval's key")?;
    let mut body: serde_json::Value =
        serde_json::from_str(&item.body).map_err(|e| e.to_string())?;
    let fields = body.as_object_mut().ok_or("not an object")?;
    for (name, value) in APPROVAL_KEYED.into_iter().zip([id, tenant]) {
        fields.entry(name).or_insert_with(|| value.into());
    }
    if !fields.contains_key(ARGS_HASH) {
        let hash = own_hash(fields)?;
        fields.insert(ARGS_HASH.into(), hash.into());
    }
    let own = DECISION_OWN.map(|name| fields.get(name).cloned());
    let mut last_at = None;
    if let Some(serde_json::Value::Array(decisions)) = fields.get_mut("decisions") {
        for decision in decisions.iter_mut().filter_map(|d| d.as_object_mut()) {
            for (name, own) in DECISION_OWN.iter().zip(&own) {
                if let Some(own) = own {
                    decision.entry(*name).or_insert_with(|| own.clone());
                }
            }
            last_at = decision.get("at").cloned();
        }
    }
    let awaiting = serde_json::to_value(ApprovalStatus::AwaitingApproval).expect("a status");
    if fields.get("status") != Some(&awaiting)
        && let Some(at) = last_at
    {
        fields.entry(RESOLVED_AT).or_insert(at);
    }
    Ok(body)
}

/// The marker of an approval whose next escalation step is to come.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EscalationDue {
    pub tenant: TenantId,
    pub approval_id: ApprovalId,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::audit::LogSlot;
    use crate::domain::ids::{ActionId, ActionVersion, RunId};
    use crate::engine::error::EngineError;
    use crate::engine::records::log::{audit_order, write_units};
    use crate::engine::records::{Tx, decode};
    use crate::ports::store::Write;
    use chrono::Utc;

    /// An approval like the bench's: a reimbursement capped at the limit, one day to decide.
    pub(crate) fn approval() -> Approval {
        use crate::domain::approval::Asking;
        use crate::domain::ids::{AgentName, PersonId, Role};
        use crate::domain::policy::{Requirement, ToolHints};
        let mut call = crate::domain::action::tests::proposed_call(
            "Claim b-000006 is one night of lodging at $480; the limit is $250 a night, so I \
             propose paying $250.",
        );
        call.tenant = TenantId::parse("bench-adf56cda").unwrap();
        call.run_id = RunId::generate();
        call.id = ActionId::generate();
        call.tool_use_id = "toolu_bench_0".into();
        call.args = crate::domain::args::Args::new(serde_json::json!({
            "amount_cents": 25000,
            "claim_id": "b-000006",
            "note": "Lodging is capped at $250 a night.",
        }))
        .unwrap();
        let requirement = Requirement {
            reason: "Reimbursements above $75 need a finance approver.".into(),
            approver_role: Role::parse("finance").unwrap(),
            quorum: 1,
            ttl: std::time::Duration::from_secs(24 * 3600),
            escalate: Vec::new(),
        };
        let now = Utc::now();
        let asking = Asking {
            agent: AgentName::parse("expense").unwrap(),
            hints: ToolHints::default(),
            requested_by: vec![PersonId::parse("emp-000006").unwrap()],
            policy_version: 1,
            opened_at: now,
            expires_at: now + chrono::Duration::hours(24),
        };
        Approval::open(call, &requirement, asking)
    }

    /// The item [`Tx::create_approval`] writes for `approval`.
    fn approval_item(approval: &Approval) -> Item {
        let mut tx = Tx::new();
        tx.create_approval(approval);
        let (mut writes, _) = tx.into_parts();
        assert_eq!(writes.len(), 1);
        let Some(Write::Put { item, .. }) = writes.pop() else {
            panic!("an approval is put")
        };
        item
    }

    fn decided(mut approval: Approval, versions: &[ActionVersion]) -> Approval {
        use crate::domain::approval::{Choice, Decision, DecisionEffect};
        use crate::domain::ids::{DecisionId, PersonId};
        let at = approval.created_at + chrono::Duration::minutes(5);
        for (n, version) in versions.iter().enumerate() {
            let own = *version == approval.action_version;
            approval.decisions.push(Decision {
                decision_id: DecisionId::parse(&format!("bench-{n}")).unwrap(),
                by: PersonId::parse("dana").unwrap(),
                choice: Choice::Approve,
                action_version: *version,
                args_hash: match own {
                    true => approval.args_hash.clone(),
                    false => crate::domain::args::ArgsHash::of_call(
                        &approval.agent,
                        &approval.tool,
                        &crate::domain::args::Args::new(serde_json::json!({"n": n})).unwrap(),
                    ),
                },
                at,
                effect: DecisionEffect::Approved,
                // As the engine writes it: the approval's item holds the `decision` event.
                logged: Some(LogSlot::new(&audit_order(), 0)),
            });
        }
        approval.status = ApprovalStatus::Approved;
        approval.resolved_at = Some(at);
        approval
    }

    #[test]
    fn an_approval_reads_back_whole_from_an_item_that_repeats_neither_its_key_nor_its_own_version()
    {
        let open = approval();
        let other = ActionVersion::FIRST.next();
        let mut full = decided(open.clone(), &[ActionVersion::FIRST, other]);
        full.reminded_at = Some(full.created_at);
        full.superseded_by = Some(ApprovalId::generate());
        for approval in [open, full] {
            let item = approval_item(&approval);
            let body: serde_json::Value = serde_json::from_str(&item.body).unwrap();
            let fields = body.as_object().unwrap();
            assert!(
                !fields.contains_key("args_hash"),
                "its own agent, tool and arguments give it"
            );
            for keyed in ["id", "tenant"] {
                assert!(!fields.contains_key(keyed), "{keyed} is in the key");
            }
            assert!(fields.values().all(|v| !v.is_null()), "{body}");
            // Every other field of the API's form is stored.
            let api = serde_json::to_value(&approval).unwrap();
            let mut expected: std::collections::BTreeSet<&str> = api
                .as_object()
                .unwrap()
                .iter()
                .filter(|(_, value)| !value.is_null())
                .map(|(name, _)| name.as_str())
                .collect();
            for left_out in APPROVAL_KEYED.into_iter().chain([ARGS_HASH, RESOLVED_AT]) {
                expected.remove(left_out);
            }
            let stored: std::collections::BTreeSet<&str> =
                fields.keys().map(String::as_str).collect();
            assert_eq!(stored, expected);
            let decisions = fields["decisions"].as_array().unwrap();
            for (decision, own) in decisions.iter().zip([true, false]) {
                for name in ["action_version", "args_hash"] {
                    assert_eq!(decision.get(name).is_none(), own, "{name} in {decision}");
                }
            }
            assert_eq!(decode::<Approval>(&item).unwrap().value, approval);
            // The API's form at the same key reads as the same approval.
            let api = Item {
                body: serde_json::to_string(&approval).unwrap(),
                ..item
            };
            assert_eq!(decode::<Approval>(&api).unwrap().value, approval);
        }
    }

    #[test]
    fn an_approval_made_under_the_first_hash_scheme_keeps_its_hash_and_reads_back_whole() {
        let mut legacy = approval();
        legacy.args_hash = serde_json::from_value(serde_json::json!(
            "sha256:b604fd708eeaef79e59d1b70d25ba4a4edcc960282a3aaa0aa2916738bc38b42"
        ))
        .unwrap();
        let item = approval_item(&legacy);
        assert!(
            item.body.contains("\"args_hash\":\"sha256:b604"),
            "{}",
            item.body
        );
        assert_eq!(decode::<Approval>(&item).unwrap().value, legacy);
    }

    #[test]
    fn a_decided_approval_is_one_write_unit_where_its_api_form_is_two() {
        let approval = decided(approval(), &[ActionVersion::FIRST]);
        let item = approval_item(&approval);
        let units = |body: &str| write_units(&item.pk, item.sk.len(), None, body);
        // Its decision resolved it, holding the `decision` event and its place in the log.
        assert!(!item.body.contains(RESOLVED_AT), "{}", item.body);
        assert!(item.body.contains("\"logged\""), "{}", item.body);
        assert_eq!(units(&serde_json::to_string(&approval).unwrap()), 2);
        assert_eq!(units(&item.body), 1);
        // With its entry in the tenant's decided list, and room to spare for longer ids.
        assert!(item.stored_size() <= 1024 - 64, "{}", item.stored_size());
        let open = approval_item(&self::approval());
        assert_eq!(
            write_units(&open.pk, open.sk.len(), open.gsi1.as_ref(), &open.body),
            1
        );
    }

    #[test]
    fn a_resolved_approval_moves_from_its_tenants_pending_list_to_its_resolved_one_newest_first() {
        let open = approval();
        let pending = approval_item(&open)
            .gsi1
            .expect("a waiting approval is listed");
        assert_eq!(pending.pk, keys::pending_index(&open.tenant));
        let decided = decided(open, &[ActionVersion::FIRST]);
        let resolved_at = decided.resolved_at.expect("resolved");
        let listed = approval_item(&decided)
            .gsi1
            .expect("a resolved approval is listed");
        assert_eq!(listed, keys::decided(&decided.tenant, resolved_at));
        assert_eq!(listed.pk, format!("TENANT#{}#DECIDED", decided.tenant));
        // Short and of one width, so a later resolution sorts first as text.
        let later = keys::newest_first(resolved_at + chrono::Duration::milliseconds(1));
        assert_eq!((listed.sk.len(), later.len()), (13, 13));
        assert!(later < listed.sk, "{later} !< {}", listed.sk);
    }

    #[test]
    fn an_approval_item_under_another_key_is_refused_as_corrupt() {
        let item = Item {
            pk: "TENANT#acme#RUN#run-1".into(),
            ..approval_item(&approval())
        };
        let error = decode::<Approval>(&item).unwrap_err();
        assert!(
            matches!(&error, EngineError::Corrupt(why) if why.contains("not an approval's key")),
            "{error}"
        );
    }
}
