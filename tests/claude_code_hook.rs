//! `countersign hook claude-code` as Claude Code runs it: a real process per hook event, its
//! input on stdin in the shape Claude Code's hooks reference gives, its answer on stdout, over a
//! real state directory that other processes decide in.

mod common;

use std::io::Write as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::Countersign;
use common::claude_code::{claude_code_dir, harness, waiting_approval};
use serde_json::{Value, json};

/// A PreToolUse input as the hooks reference shows it, for `tool_name` with `tool_input`.
fn pre_tool_use(tool_use_id: &str, tool_name: &str, tool_input: Value) -> String {
    json!({
        "session_id": "abc123",
        "transcript_path": "/home/user/.claude/projects/my-project/00893aaf-19fa-41d2-8238-13269b9b3ca0.jsonl",
        "cwd": "/home/user/my-project",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool_name,
        "tool_input": tool_input,
        "tool_use_id": tool_use_id
    })
    .to_string()
}

/// `countersign hook claude-code --as dev-bot ARGS` started with `input` on its stdin.
fn hook(cs: &Countersign, input: &str, args: &[&str]) -> Child {
    hook_as(cs, "dev-bot", input, args)
}

/// [`hook`] for `person`.
fn hook_as(cs: &Countersign, person: &str, input: &str, args: &[&str]) -> Child {
    let mut child = common::countersign(cs.state())
        .args(["hook", "claude-code", "--as", person])
        .args(args)
        .envs(cs.env().iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the hook starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child
}

/// What a hook process answered: its exit status, stdout and stderr.
fn answered(child: Child) -> (i32, String, String) {
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into(),
        String::from_utf8_lossy(&output.stderr).into(),
    )
}

/// The hook's answer to `input`, which must exit 0 with one JSON object.
#[track_caller]
fn decided(cs: &Countersign, input: &str, args: &[&str]) -> Value {
    let (exit, stdout, stderr) = answered(hook(cs, input, args));
    assert_eq!(exit, 0, "{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

/// A PreToolUse answer exactly as the hooks reference shapes it.
fn decision(word: &str, reason: &str, updated_input: Option<Value>) -> Value {
    let mut output = json!({
        "hookEventName": "PreToolUse",
        "permissionDecision": word,
        "permissionDecisionReason": reason,
    });
    if let Some(input) = updated_input {
        output["updatedInput"] = input;
    }
    json!({ "hookSpecificOutput": output })
}

fn key_reason(answer: &Value) -> &str {
    answer["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap()
}

#[test]
fn given_a_test_command_when_hooked_then_it_is_allowed_at_once_with_its_input() {
    let cs = harness("hook-allow");
    let input = pre_tool_use("toolu_01ABC123", "Bash", json!({"command": "npm test"}));

    let started = Instant::now();
    let answer = decided(&cs, &input, &[]);

    let reason = key_reason(&answer).to_string();
    assert!(
        reason.starts_with("Countersign: approved; handed to Claude Code once as act-")
            && reason.ends_with(":1"),
        "{reason}"
    );
    assert_eq!(
        answer,
        decision("allow", &reason, Some(json!({"command": "npm test"})))
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn given_a_push_to_main_when_a_lead_approves_from_another_process_then_the_hook_allows_within_a_second()
 {
    let cs = harness("hook-approve");
    let push = json!({"command": "git push origin main", "description": "Push to main"});
    let waiting = hook(&cs, &pre_tool_use("toolu_push", "Bash", push.clone()), &[]);

    let approval = waiting_approval(&cs);
    assert_eq!(approval["args"], push);
    assert_eq!(approval["tool_use_id"], "toolu_push");
    assert_eq!(approval["approver_role"], "lead");
    let id = approval["id"].as_str().unwrap();
    cs.ok(&["review", "approve", id, "--as", "lin"]);
    let approved = Instant::now();

    let (exit, stdout, stderr) = answered(waiting);
    let within = approved.elapsed();
    assert_eq!(exit, 0, "{stderr}");
    assert!(
        within < Duration::from_secs(1),
        "answered {within:?} after the approval"
    );
    let answer: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        answer,
        decision("allow", key_reason(&answer), Some(push.clone()))
    );

    // Claude Code ran it: PostToolUse reports what it returned, and the audit holds it.
    let post = json!({
        "session_id": "abc123",
        "transcript_path": "/home/user/.claude/projects/my-project/00893aaf-19fa-41d2-8238-13269b9b3ca0.jsonl",
        "cwd": "/home/user/my-project",
        "permission_mode": "default",
        "hook_event_name": "PostToolUse",
        "tool_name": "Bash",
        "tool_input": push,
        "tool_response": {"stdout": "To github.com:acme/app.git\n   1a2b3c4..5d6e7f8  main -> main", "stderr": "", "interrupted": false},
        "tool_use_id": "toolu_push"
    });
    let (exit, stdout, stderr) = answered(hook(&cs, &post.to_string(), &[]));
    assert_eq!((exit, stdout.as_str()), (0, ""), "{stderr}");
    let audit = cs.ok(&["audit", id]);
    let action = &audit["actions"][0];
    assert_eq!(action["status"], "succeeded", "{audit}");
    assert!(audit.to_string().contains("main -> main"), "{audit}");
}

#[test]
fn given_a_push_to_main_when_the_lead_rejects_it_then_the_hook_denies_with_the_reason() {
    let cs = harness("hook-reject");
    let waiting = hook(
        &cs,
        &pre_tool_use(
            "toolu_rej",
            "Bash",
            json!({"command": "git push origin main"}),
        ),
        &[],
    );
    let approval = waiting_approval(&cs);
    cs.ok(&[
        "review",
        "reject",
        approval["id"].as_str().unwrap(),
        "--as",
        "lin",
        "--reason",
        "open a pull request instead",
    ]);

    let (exit, stdout, stderr) = answered(waiting);
    assert_eq!(exit, 0, "{stderr}");
    let answer: Value = serde_json::from_str(stdout.trim()).unwrap();
    let reason = key_reason(&answer);
    assert!(reason.contains("open a pull request instead"), "{reason}");
    assert_eq!(answer, decision("deny", reason, None));
}

#[test]
fn given_nobody_decides_in_time_then_the_hook_asks_or_defers_as_told() {
    let cs = harness("hook-timeout");
    let rm = json!({"command": "rm -rf node_modules"});

    let asked = decided(
        &cs,
        &pre_tool_use("toolu_rm", "Bash", rm.clone()),
        &["--wait", "1s"],
    );
    let reason = key_reason(&asked);
    assert!(
        reason.starts_with("Countersign: no decision within 1s on approval ap-")
            && reason.contains("(lead decides, until ")
            && reason.ends_with("; asking here instead"),
        "{reason}"
    );
    assert_eq!(asked, decision("ask", reason, None));

    let deferred = decided(
        &cs,
        &pre_tool_use("toolu_rm", "Bash", rm),
        &["--wait", "0s", "--on-timeout", "defer"],
    );
    let reason = key_reason(&deferred);
    assert!(
        reason.ends_with("; deferred: resume the session once it is decided"),
        "{reason}"
    );
    assert_eq!(deferred, decision("defer", reason, None));
    // The repeated call attached: one approval waits, not two.
    let listed = cs.ok(&["review", "--as", "lin"]);
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
}

#[test]
fn given_an_approval_given_while_no_hook_waited_when_the_call_comes_again_then_it_is_honoured_once()
{
    let cs = harness("hook-resume");
    let input = pre_tool_use("toolu_tf", "Bash", json!({"command": "terraform apply"}));
    let deferred = decided(&cs, &input, &["--wait", "0s", "--on-timeout", "defer"]);
    assert_eq!(
        deferred["hookSpecificOutput"]["permissionDecision"],
        "defer"
    );
    let approval = waiting_approval(&cs);
    cs.ok(&[
        "review",
        "approve",
        approval["id"].as_str().unwrap(),
        "--as",
        "lin",
    ]);

    // The resumed session sends the same call again: it attaches and is allowed.
    let allowed = decided(&cs, &input, &["--wait", "0s"]);
    assert_eq!(
        allowed,
        decision(
            "allow",
            key_reason(&allowed),
            Some(json!({"command": "terraform apply"}))
        )
    );

    // Once handed over, never again, and at once: the hook does not wait on a call running in
    // Claude Code.
    let started = Instant::now();
    let again = decided(&cs, &input, &[]);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        again,
        decision(
            "deny",
            "Countersign: this call (toolu_tf) was already handed to Claude Code once; it does \
             not run twice.",
            None
        )
    );
}

#[test]
fn given_an_input_without_a_tool_use_id_then_its_id_is_derived_from_the_session_and_the_call() {
    let cs = harness("hook-derived");
    let mut input: Value = serde_json::from_str(&pre_tool_use(
        "unused",
        "Bash",
        json!({"command": "cargo build"}),
    ))
    .unwrap();
    input.as_object_mut().unwrap().remove("tool_use_id");

    let first = decided(&cs, &input.to_string(), &[]);
    assert_eq!(first["hookSpecificOutput"]["permissionDecision"], "allow");

    // The same call in the same session is that call, already handed over.
    let again = decided(&cs, &input.to_string(), &[]);
    let reason = key_reason(&again);
    assert!(
        reason.starts_with("Countersign: this call (derived-")
            && reason.contains("does not run twice"),
        "{reason}"
    );

    // Another session's identical call is another call.
    input["session_id"] = json!("def456");
    let other = decided(&cs, &input.to_string(), &[]);
    assert_eq!(other["hookSpecificOutput"]["permissionDecision"], "allow");
}

#[test]
fn given_a_tool_the_agent_does_not_list_then_the_hook_passes_it_through_silently() {
    let cs = harness("hook-read");
    let input = pre_tool_use(
        "toolu_read",
        "Read",
        json!({"file_path": "/home/user/my-project/README.md"}),
    );

    let (exit, stdout, stderr) = answered(hook(&cs, &input, &[]));

    assert_eq!((exit, stdout.as_str(), stderr.as_str()), (0, "", ""));
}

#[test]
fn given_bad_input_then_the_hook_exits_2_and_stores_nothing() {
    let cs = harness("hook-bad");
    for (input, says) in [
        ("not json", "is not a Claude Code tool event"),
        (r#"{"hook_event_name":"PreToolUse"}"#, "missing field"),
        (
            &*json!({"session_id": "abc123", "hook_event_name": "Stop", "tool_name": "Bash", "tool_input": {}}).to_string(),
            "not \"Stop\"",
        ),
    ] {
        let (exit, stdout, stderr) = answered(hook(&cs, input, &[]));
        assert_eq!((exit, stdout.as_str()), (2, ""), "{input}: {stderr}");
        assert!(stderr.contains(says), "{input}: {stderr}");
    }
    assert!(
        !cs.state().exists(),
        "the state directory was not even opened"
    );
}

#[test]
fn given_a_person_the_directory_does_not_know_then_the_hook_blocks_with_exit_2() {
    let cs = harness("hook-unknown-person");
    let input = pre_tool_use("toolu_x", "Bash", json!({"command": "npm test"}));

    let (exit, stdout, stderr) = answered(hook_as(&cs, "nobody", &input, &[]));

    assert_eq!((exit, stdout.as_str()), (2, ""), "{stderr}");
    assert!(stderr.contains("nobody"), "{stderr}");
}

#[test]
fn the_shipped_claude_code_policy_holds_to_its_cases() {
    let cs = harness("hook-policy");
    let cases = format!("{}/policy-cases.toml", claude_code_dir());
    let held = cs.printed(&["policy", "test", "--agent", &claude_code_dir(), &cases]);
    assert!(
        held.contains("17 of 17 cases hold for claude-code"),
        "{held}"
    );
}
