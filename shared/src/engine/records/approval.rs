//! An approval's item: its stored form, and the marker that puts it in the escalation index.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::keys;
use crate::domain::approval::{
    Approval, ApprovalKind, ApprovalStatus, Choice, Comment, Decision, DecisionEffect,
    PreviousVersion, is_plain,
};
use crate::domain::args::{Args, ArgsHash};
use crate::domain::identity::Standing;
use crate::domain::ids::{
    ActionId, ActionVersion, AgentName, ApprovalId, DecisionId, PersonId, Role, RunId, TenantId,
};
use crate::domain::log_slot::LogSlot;
use crate::domain::policy::history::HistorySlot;
use crate::domain::policy::{Escalation, LogOnly, Need, ToolHints};
use crate::ports::store::Item;

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
/// [`read_approval`] fills them back. The `decision` events are the decisions themselves, each
/// with where it sits in the run's log ([`held_by_approval`]).
///
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
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    also: &'a [Need],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    rules: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    log_only: Option<&'a LogOnly>,
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
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    counted: &'a [HistorySlot],
    #[serde(skip_serializing_if = "Option::is_none")]
    standing: Option<&'a Standing>,
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
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    roles: &'a [Role],
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
            also,
            rules,
            log_only,
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
            counted,
            standing,
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
                    roles,
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
                    roles,
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
            also,
            rules,
            log_only: log_only.as_ref(),
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
            counted,
            standing: standing.as_ref(),
        }
    }
}

/// An approval's item as read back ([`approval_body`]): [`Approval`]'s fields in its own forms,
/// those the item may leave out optional. Deserialized straight from the body, not through a
/// JSON value. The API's form, which leaves nothing out, reads the same way.
#[derive(Deserialize)]
struct LoadedApproval {
    #[serde(default)]
    id: Option<ApprovalId>,
    #[serde(default)]
    tenant: Option<TenantId>,
    agent: AgentName,
    #[serde(default)]
    kind: ApprovalKind,
    run_id: RunId,
    action_id: ActionId,
    action_version: ActionVersion,
    tool_use_id: String,
    tool: String,
    #[serde(default)]
    hints: ToolHints,
    args: Args,
    #[serde(default)]
    args_hash: Option<ArgsHash>,
    explanation: String,
    #[serde(default)]
    previous: Option<PreviousVersion>,
    reason: String,
    approver_role: Role,
    quorum: u8,
    #[serde(default)]
    also: Vec<Need>,
    #[serde(default)]
    rules: Vec<String>,
    #[serde(default)]
    log_only: Option<LogOnly>,
    requested_by: Vec<PersonId>,
    policy_version: u32,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    status: ApprovalStatus,
    #[serde(default)]
    decisions: Vec<LoadedDecision>,
    #[serde(default)]
    superseded_by: Option<ApprovalId>,
    #[serde(default)]
    resolved_at: Option<DateTime<Utc>>,
    #[serde(default)]
    reminded_at: Option<DateTime<Utc>>,
    #[serde(default)]
    comments: Vec<Comment>,
    #[serde(default)]
    escalate: Vec<Escalation>,
    #[serde(default)]
    escalated_to: Vec<Role>,
    #[serde(default)]
    counted: Vec<HistorySlot>,
    #[serde(default)]
    standing: Option<Standing>,
}

/// A decision as its approval's item holds it ([`StoredDecision`]).
#[derive(Deserialize)]
struct LoadedDecision {
    decision_id: DecisionId,
    by: PersonId,
    #[serde(flatten)]
    choice: Choice,
    #[serde(default)]
    action_version: Option<ActionVersion>,
    #[serde(default)]
    args_hash: Option<ArgsHash>,
    at: DateTime<Utc>,
    effect: DecisionEffect,
    #[serde(default)]
    roles: Vec<Role>,
    #[serde(default)]
    logged: Option<LogSlot>,
}

/// An approval from its item ([`approval_body`]), the fields left out filled back: its id and
/// tenant from the item's key, its hash from its agent, tool and arguments, its decisions'
/// version and hash from its own, and when it was resolved from its last decision. A field the
/// body holds is kept as it is.
pub(super) fn read_approval(item: &Item) -> Result<Approval, String> {
    let (tenant, id) = keys::approval_of(&item.pk).ok_or("not an approval's key")?;
    let loaded: LoadedApproval = serde_json::from_str(&item.body).map_err(|e| e.to_string())?;
    let id = match loaded.id {
        Some(id) => id,
        None => ApprovalId::parse(id).map_err(|e| format!("id: {e}"))?,
    };
    let tenant = match loaded.tenant {
        Some(tenant) => tenant,
        None => TenantId::parse(tenant).map_err(|e| format!("tenant: {e}"))?,
    };
    let args_hash = loaded
        .args_hash
        .unwrap_or_else(|| ArgsHash::of_call(&loaded.agent, &loaded.tool, &loaded.args));
    let action_version = loaded.action_version;
    let last_at = loaded.decisions.last().map(|decision| decision.at);
    let resolved_at = match loaded.status {
        ApprovalStatus::AwaitingApproval => loaded.resolved_at,
        _ => loaded.resolved_at.or(last_at),
    };
    let decisions = loaded
        .decisions
        .into_iter()
        .map(|decision| Decision {
            decision_id: decision.decision_id,
            by: decision.by,
            choice: decision.choice,
            action_version: decision.action_version.unwrap_or(action_version),
            args_hash: decision.args_hash.unwrap_or_else(|| args_hash.clone()),
            at: decision.at,
            effect: decision.effect,
            roles: decision.roles,
            logged: decision.logged,
        })
        .collect();
    // Every field named: one added to `Approval` fails to compile here until it is read.
    Ok(Approval {
        id,
        tenant,
        agent: loaded.agent,
        kind: loaded.kind,
        run_id: loaded.run_id,
        action_id: loaded.action_id,
        action_version,
        tool_use_id: loaded.tool_use_id,
        tool: loaded.tool,
        hints: loaded.hints,
        args: loaded.args,
        args_hash,
        explanation: loaded.explanation,
        previous: loaded.previous,
        reason: loaded.reason,
        approver_role: loaded.approver_role,
        quorum: loaded.quorum,
        also: loaded.also,
        rules: loaded.rules,
        log_only: loaded.log_only,
        requested_by: loaded.requested_by,
        policy_version: loaded.policy_version,
        created_at: loaded.created_at,
        expires_at: loaded.expires_at,
        status: loaded.status,
        decisions,
        superseded_by: loaded.superseded_by,
        resolved_at,
        reminded_at: loaded.reminded_at,
        comments: loaded.comments,
        escalate: loaded.escalate,
        escalated_to: loaded.escalated_to,
        counted: loaded.counted,
        standing: loaded.standing,
    })
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
    use crate::domain::ids::{ActionId, ActionVersion, RunId};
    use crate::domain::log_slot::LogSlot;
    use crate::engine::error::EngineError;
    use crate::engine::records::log::{audit_order, write_units};
    use crate::engine::records::{Tx, decode, decode_approval};
    use crate::ports::store::Write;
    use chrono::Utc;

    /// The fields an approval's item leaves out where they are the approval's own or its key's.
    const APPROVAL_KEYED: [&str; 2] = ["id", "tenant"];
    const ARGS_HASH: &str = "args_hash";
    const RESOLVED_AT: &str = "resolved_at";

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
            also: Vec::new(),
        };
        let now = Utc::now();
        let asking = Asking {
            agent: AgentName::parse("expense").unwrap(),
            hints: ToolHints::default(),
            requested_by: vec![PersonId::parse("emp-000006").unwrap()],
            standing: None,
            policy_version: 1,
            opened_at: now,
            expires_at: now + chrono::Duration::hours(24),
        };
        Approval::open(call, &requirement, asking)
    }

    /// The item [`Tx::create_approval`] writes for `approval` (beside its requester's slot).
    fn approval_item(approval: &Approval) -> Item {
        let mut tx = Tx::new();
        tx.create_approval(approval);
        let (writes, _, _) = tx.into_parts();
        let approvals: Vec<Item> = writes
            .into_iter()
            .filter_map(|write| match write {
                Write::Put { item, .. } if item.sk == keys::APPROVAL_SK => Some(item),
                _ => None,
            })
            .collect();
        let [item] = <[Item; 1]>::try_from(approvals).expect("one approval is put");
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
                roles: vec![approval.approver_role.clone()],
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
        // An edited approval's own version is not the first: a decision about the first differs.
        let mut edited = open.clone();
        edited.action_version = ActionVersion::FIRST.next();
        let own = edited.action_version;
        let mut full = decided(edited, &[own, ActionVersion::FIRST]);
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
            assert_eq!(decode_approval(&item).unwrap().value, approval);
            // Read as another type, it is read whole too.
            assert_eq!(decode::<serde_json::Value>(&item).unwrap().value, api);
            // The API's form at the same key reads as the same approval.
            let api = Item {
                body: serde_json::to_string(&approval).unwrap(),
                ..item
            };
            assert_eq!(decode_approval(&api).unwrap().value, approval);
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
        assert_eq!(decode_approval(&item).unwrap().value, legacy);
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
        let error = decode_approval(&item).unwrap_err();
        assert!(
            matches!(&error, EngineError::Corrupt(why) if why.contains("not an approval's key")),
            "{error}"
        );
    }
}
