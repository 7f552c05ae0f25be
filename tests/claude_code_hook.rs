//! `countersign hook claude-code` as Claude Code runs it: a real process per hook event, its
//! input on stdin in the shape Claude Code's hooks reference gives, its answer on stdout, over a
//! real state directory that other processes decide in.

mod common;

use std::io::Write as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::Countersign;
use common::claude_code::{
    claude_code_dir, harness, harness_over, lead_approves, lead_rejects, waiting_approval,
};
use serde_json::{Value, json};
use shared::api::claude_code::{MAX_EVENT_BYTES, decision};

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
    lead_approves(&cs, id);
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
    lead_rejects(
        &cs,
        approval["id"].as_str().unwrap(),
        "open a pull request instead",
    );

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
    lead_approves(&cs, approval["id"].as_str().unwrap());

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

/// The shipped claude-code agent in a directory of the test's own, with one MCP tool listed by
/// the name Claude Code gives it, `mcp__github__create_issue`, which a rule sends to a lead.
fn claude_code_listing_an_mcp_tool(name: &str) -> String {
    let dir = common::fresh_path(name).join("claude-code");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["agent.toml", "policy.toml", "rules.cedar", "people.toml"] {
        std::fs::copy(format!("{}/{file}", claude_code_dir()), dir.join(file)).unwrap();
    }
    let append = |file: &str, text: &str| {
        let shipped = std::fs::read_to_string(dir.join(file)).unwrap();
        std::fs::write(dir.join(file), shipped + text).unwrap();
    };
    append(
        "agent.toml",
        r#"
[tools.mcp__github__create_issue]
description = "The github MCP server's create_issue, as Claude Code names it."
input_schema = { type = "object", required = ["repo", "title"], properties = { repo = { type = "string" }, title = { type = "string" } } }
executor = "caller"
"#,
    );
    append(
        "rules.cedar",
        r#"
@id("issues on the api repository")
@approve("lead")
@reason("An issue on acme/api needs a lead.")
permit(principal, action == Action::"mcp__github__create_issue", resource)
when { context.input.repo == "acme/api" };
"#,
    );
    dir.display().to_string()
}

#[test]
fn given_an_mcp_tool_the_agent_lists_by_its_full_name_then_the_hook_gates_it_and_other_mcp_tools_pass_through()
 {
    let agent = claude_code_listing_an_mcp_tool("hook-mcp-agent");
    let cs = harness_over("hook-mcp", &agent);
    let issue =
        json!({"repo": "acme/api", "title": "Flaky deploy", "body": "It fails on Mondays."});
    let input = pre_tool_use("toolu_mcp", "mcp__github__create_issue", issue.clone());

    let answer = decided(&cs, &input, &["--wait", "0s", "--on-timeout", "defer"]);

    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "defer",
        "{answer}"
    );
    let approval = waiting_approval(&cs);
    assert_eq!(approval["tool"], "mcp__github__create_issue");
    assert_eq!(
        approval["args"], issue,
        "a field the schema does not name passes as it came"
    );
    assert_eq!(approval["reason"], "An issue on acme/api needs a lead.");
    let read = pre_tool_use(
        "toolu_mcp_read",
        "mcp__github__get_issue",
        json!({"number": 7}),
    );
    let (exit, stdout, stderr) = answered(hook(&cs, &read, &[]));
    assert_eq!((exit, stdout.as_str(), stderr.as_str()), (0, "", ""));
}

#[test]
fn given_bad_input_then_the_hook_exits_2_and_stores_nothing() {
    let cs = harness("hook-bad");
    // One byte past the most the hook reads, all of it read before the hook answers.
    let too_large = format!("{{\"pad\":\"{}\"}}", "x".repeat(MAX_EVENT_BYTES + 1 - 10));
    for (input, says) in [
        (too_large.as_str(), "has more than 1048576 bytes"),
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

/// `POST /hooks/claude-code/{target}` (an agent and a query) on the server at `base` with
/// `body`, as Claude Code's http hook sends it, with `token` as the bearer: the status and the
/// body's text.
async fn post_hook(base: &str, token: Option<&str>, target: &str, body: String) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/hooks/claude-code/{target}"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// The http hook's answer to `body`, which must be a 200 with one JSON object.
async fn hooked(base: &str, token: &str, target: &str, body: String) -> Value {
    let (status, text) = post_hook(base, Some(token), target, body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_the_http_hook_when_a_lead_approves_from_another_process_then_it_allows_within_a_second_and_post_tool_use_reports()
 {
    let cs = harness("http-hook-approve");
    let served = cs.serve();
    let bot = cs.token("dev-bot");
    let push = json!({"command": "git push origin main"});
    let input = pre_tool_use("toolu_http_push", "Bash", push.clone());
    let waiting = tokio::spawn({
        let (base, bot) = (served.base.clone(), bot.clone());
        async move {
            let answer = hooked(&base, &bot, "claude-code", input).await;
            (answer, Instant::now())
        }
    });

    let approval = tokio::task::block_in_place(|| waiting_approval(&cs));
    assert_eq!(approval["tool_use_id"], "toolu_http_push");
    let id = approval["id"].as_str().unwrap().to_string();
    tokio::task::block_in_place(|| lead_approves(&cs, &id));
    let approved = Instant::now();

    let (answer, at) = waiting.await.unwrap();
    let within = at.saturating_duration_since(approved);
    assert!(
        within < Duration::from_secs(1),
        "answered {within:?} after the approval"
    );
    assert_eq!(
        answer,
        decision("allow", key_reason(&answer), Some(push.clone()))
    );

    // A response larger than the gate's 64 KiB body, as an Edit's is with the file it changed.
    let stdout = format!("main -> main{}", " ".repeat(100_000));
    let post = json!({
        "session_id": "abc123", "hook_event_name": "PostToolUse", "tool_name": "Bash",
        "tool_input": push, "tool_use_id": "toolu_http_push",
        "tool_response": {"stdout": stdout, "stderr": "", "interrupted": false},
    });
    let (status, text) = post_hook(&served.base, Some(&bot), "claude-code", post.to_string()).await;
    assert_eq!((status, text.as_str()), (200, ""));
    let audit = tokio::task::block_in_place(|| cs.ok(&["audit", &id]));
    assert_eq!(audit["actions"][0]["status"], "succeeded", "{audit}");
    assert!(audit.to_string().contains("main -> main"), "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_the_http_hook_when_nobody_decides_in_the_asked_wait_then_it_defers_and_a_rejection_is_then_denied()
 {
    let cs = harness("http-hook-defer");
    let served = cs.serve();
    let bot = cs.token("dev-bot");
    let input = pre_tool_use("toolu_http_rm", "Bash", json!({"command": "rm -rf dist"}));

    let deferred = hooked(
        &served.base,
        &bot,
        "claude-code?wait=0.2&on_timeout=defer",
        input.clone(),
    )
    .await;
    let reason = key_reason(&deferred);
    assert!(
        reason.starts_with("Countersign: no decision within 200ms on approval ap-")
            && reason.ends_with("; deferred: resume the session once it is decided"),
        "{reason}"
    );
    assert_eq!(deferred, decision("defer", reason, None));

    let approval = tokio::task::block_in_place(|| waiting_approval(&cs));
    let id = approval["id"].as_str().unwrap();
    tokio::task::block_in_place(|| lead_rejects(&cs, id, "keep dist"));
    let denied = hooked(&served.base, &bot, "claude-code?wait=0", input).await;
    let reason = key_reason(&denied);
    assert!(reason.contains("keep dist"), "{reason}");
    assert_eq!(denied, decision("deny", reason, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_person_at_their_share_of_waits_then_the_http_hook_answers_their_next_call_at_once()
{
    let cs = harness("http-hook-share");
    let served = cs.serve_with(&["--max-waiting-per-person", "1"]);
    let bot = cs.token("dev-bot");
    let first = pre_tool_use(
        "toolu_wait_1",
        "Bash",
        json!({"command": "terraform apply"}),
    );
    let holding = tokio::spawn({
        let (base, bot) = (served.base.clone(), bot.clone());
        async move { hooked(&base, &bot, "claude-code?wait=10s", first).await }
    });
    tokio::task::block_in_place(|| waiting_approval(&cs));

    let second = pre_tool_use("toolu_wait_2", "Bash", json!({"command": "rm -r tmp"}));
    let started = Instant::now();
    let asked = hooked(&served.base, &bot, "claude-code?wait=10s", second).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "it did not wait"
    );
    let reason = key_reason(&asked);
    assert!(
        reason.starts_with("Countersign: no decision within 0s on approval ap-")
            && reason.ends_with("; asking here instead"),
        "{reason}"
    );
    assert_eq!(asked, decision("ask", reason, None));
    holding.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_the_http_hook_then_unlisted_tools_pass_and_bad_requests_are_refused_storing_nothing()
{
    let cs = harness("http-hook-refusals");
    let served = cs.serve();
    let bot = cs.token("dev-bot");

    let read = pre_tool_use("toolu_read", "Read", json!({"file_path": "/tmp/README.md"}));
    let (status, text) = post_hook(&served.base, Some(&bot), "claude-code", read).await;
    assert_eq!((status, text.as_str()), (200, ""));

    let push = pre_tool_use(
        "toolu_x",
        "Bash",
        json!({"command": "git push origin main"}),
    );
    for (token, target, body, status, code) in [
        (None, "claude-code", push.clone(), 401, "missing_token"),
        (Some(&bot), "claude-code", "not json".to_string(), 400, "hook_event"),
        (
            Some(&bot),
            "claude-code",
            json!({"session_id": "abc123", "hook_event_name": "Stop", "tool_name": "Bash", "tool_input": {}}).to_string(),
            400,
            "hook_event",
        ),
        (Some(&bot), "claude-code?wait=soon", push.clone(), 400, "invalid_field"),
        (Some(&bot), "claude-code?on_timeout=allow", push.clone(), 400, "invalid_field"),
        (Some(&bot), "claude-code?limit=3", push.clone(), 400, "invalid_field"),
    ] {
        let (got, text) = post_hook(&served.base, token.map(String::as_str), target, body).await;
        let refused: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!((got, refused["error"]["code"].as_str()), (status, Some(code)), "{target}: {text}");
    }

    // A PreToolUse the hook cannot decide is denied: Claude Code takes any other status as a
    // non-blocking error, and goes on.
    let denied = hooked(&served.base, &bot, "no-such-agent", push).await;
    let reason = key_reason(&denied);
    assert!(
        reason.starts_with("Countersign could not decide: "),
        "{reason}"
    );
    assert_eq!(denied, decision("deny", reason, None));
    let listed = tokio::task::block_in_place(|| cs.ok(&["review", "--as", "lin"]));
    assert_eq!(listed["approvals"], json!([]), "nothing was stored");
}
