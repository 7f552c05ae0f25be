"""The examples, end to end. LangGraph and the OpenAI Agents SDK: the agent process proposes a
USD 125 refund through the gate, a finance manager lowers it to USD 75 from the CLI in another
process, and the agent's own refund function runs once with USD 75 under version 2's key. The
Claude Agent SDK: the real `claude` CLI, pinned as the Rust tests pin it, asks ``can_use_tool``
about a Bash command the claude-code policy gates; a lead decides from another process."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))
from server import ServerTest  # noqa: E402


def waiting(test: ServerTest, person: str, wanted: Callable[[dict], bool]) -> dict:
    """The approval waiting in ``person``'s tenant that ``wanted`` picks, polled as a reviewer
    would."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for approval in test.server.waiting(person, timeout=0):
            if wanted(approval):
                return approval
        time.sleep(0.1)
    test.fail(f"no approval waits for {person}")


class ExamplesTest(ServerTest):

    def run_example(self, script: str, order: str) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            ledger = Path(scratch) / "refunds.jsonl"
            env = {
                **os.environ,
                "COUNTERSIGN_URL": self.server.url,
                "COUNTERSIGN_TOKEN": self.server.token("helpdesk-bot"),
                "REFUNDS_LEDGER": str(ledger),
                "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1] / "clients" / "python")]),
            }
            agent = subprocess.Popen(
                [sys.executable, str(HERE / script), f"Order {order} arrived broken: refund USD 125."],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            approval = waiting(self, "fran", lambda a: a["args"].get("order_id") == order)
            self.assertEqual(approval["tool"], "refund")
            self.assertEqual(approval["args"], {"order_id": order, "amount_cents": 12500})
            self.assertFalse(ledger.exists(), "nothing is refunded before a decision")

            self.server.cli("review", "edit", approval["id"], "--amount", "75", "--as", "fran", "--note", "partial damage")
            out, err = agent.communicate(timeout=60)
            self.assertEqual(agent.returncode, 0, err)

            [entry] = [json.loads(line) for line in ledger.read_text().splitlines()]
            self.assertEqual((entry["order_id"], entry["amount_cents"]), (order, 7500))
            self.assertTrue(entry["key"].endswith(":2"), entry)
            self.assertIn(f"Refunded USD 75.00 on order {order} (key {entry['key']})", out)
            audit = self.server.cli("audit", approval["id"])
            self.assertIn("7500", audit)
            self.assertIn("partial damage", audit)

    def test_the_langgraph_agent_runs_the_lowered_refund_once(self) -> None:
        self.run_example("langgraph_agent.py", "A-1001")

    def test_the_openai_agents_sdk_agent_runs_the_lowered_refund_once(self) -> None:
        self.run_example("openai_agents_agent.py", "A-2002")


def claude() -> str:
    """The `claude` CLI the Rust tests run (COUNTERSIGN_CLAUDE, else where scripts/mcp-npm puts
    it), checked to be the version tests/npm/claude-code pins."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "countersign"
    cli = os.environ.get("COUNTERSIGN_CLAUDE", str(cache / "claude-code" / "node_modules" / ".bin" / "claude"))
    manifest = json.loads((REPO / "tests" / "npm" / "claude-code" / "package.json").read_text())
    pinned = manifest["dependencies"]["@anthropic-ai/claude-code"]
    version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.split()[0] == pinned, f"{cli} is not the pinned Claude Code {pinned}: {version}"
    return cli


class ScriptedMessages:
    """An Anthropic Messages API on loopback that plays a model asking for one Bash call, as
    tests/common/claude_code.rs's does: its first turn is that ``tool_use``, every turn after a
    tool result is the text "Done.". It streams its answers, as Claude Code asks, and keeps each
    request's body."""

    def __init__(self, tool_use_id: str, command: str) -> None:
        self.tool_use_id = tool_use_id
        self.command = command
        self.requests: list[dict[str, Any]] = []
        script = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path.split("?")[0] != "/v1/messages" or body.get("stream") is not True:
                    self.send_error(400, "this script answers streamed messages only")
                    return
                script.requests.append(body)
                stream = script.stream(body).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(stream)))
                self.end_headers()
                self.wfile.write(stream)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def tool_results(self) -> list[dict[str, Any]]:
        """Every ``tool_result`` block it was sent, in order."""
        return [
            block
            for body in self.requests
            if isinstance(body["messages"][-1]["content"], list)
            for block in body["messages"][-1]["content"]
            if block.get("type") == "tool_result"
        ]

    def stream(self, body: dict[str, Any]) -> str:
        """The next turn after ``body``'s messages, as the API's server-sent events."""
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": "Done."}
            stop_reason = "end_turn"
        else:
            start = {"type": "tool_use", "id": self.tool_use_id, "name": "Bash", "input": {}}
            call = {"command": self.command, "description": "Append a line"}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(call)}
            stop_reason = "tool_use"
        message = {
            "id": "msg_scripted", "type": "message", "role": "assistant", "model": body["model"],
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }
        events = [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": start},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]
        return "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ClaudeAgentSdkTest(ServerTest):
    """The Claude Agent SDK example over the claude-code agent: the SDK starts the pinned
    `claude`, whose scripted model asks for a recursive rm the starting policy sends to a lead."""

    example = REPO / "examples" / "claude-code"
    command = "rm -rf build && echo ran | tee -a out.txt"

    def ask(self, tool_use_id: str) -> tuple[ScriptedMessages, Path, subprocess.Popen[str]]:
        """The example started in a scratch project, its model asking for the command as
        ``tool_use_id``: the model, the project, and the running agent."""
        model = ScriptedMessages(tool_use_id, self.command)
        self.addCleanup(model.close)
        scratch = tempfile.TemporaryDirectory(prefix="countersign-sdk-")
        self.addCleanup(scratch.cleanup)
        project, home = Path(scratch.name) / "project", Path(scratch.name) / "home"
        project.mkdir()
        home.mkdir()
        # Nothing of the shell's environment but PATH: Claude Code offline, against the script.
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO / "clients" / "python")]),
            "COUNTERSIGN_URL": self.server.url,
            "COUNTERSIGN_TOKEN": self.server.token("dev-bot"),
            "CLAUDE_CLI": claude(),
            "ANTHROPIC_BASE_URL": model.url,
            "ANTHROPIC_API_KEY": "sk-ant-scripted",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        agent = subprocess.Popen(
            [sys.executable, str(HERE / "claude_agent_sdk_agent.py"), "Clean the build and note it."],
            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.addCleanup(lambda: agent.poll() is None and agent.kill())
        return model, project, agent

    def finished(self, agent: subprocess.Popen[str]) -> str:
        out, err = agent.communicate(timeout=60)
        self.assertEqual(agent.returncode, 0, f"{out}\n{err}")
        return out

    def test_a_gated_command_the_lead_approves_from_another_process_runs_once_and_the_audit_holds_its_output(self) -> None:
        model, project, agent = self.ask("toolu_01SdkApprove")
        approval = waiting(self, "lin", lambda a: a.get("tool_use_id") == "toolu_01SdkApprove")
        self.assertEqual(approval["args"]["command"], self.command)
        self.assertFalse((project / "out.txt").exists(), "it waits for the lead")

        self.server.cli("review", "approve", approval["id"], "--as", "lin")
        self.assertIn("Done.", self.finished(agent))
        self.assertEqual((project / "out.txt").read_text(), "ran\n", "it ran once")
        [told] = model.tool_results()
        self.assertEqual(told["tool_use_id"], "toolu_01SdkApprove")
        self.assertEqual(told["content"], "ran")
        audit = json.loads(self.server.cli("audit", approval["id"], "--json"))
        [executed] = [entry for entry in audit["entries"] if entry["event"] == "executed"]
        self.assertTrue(executed["succeeded"], audit)
        self.assertEqual(json.loads(executed["result"])["stdout"], "ran", audit)
        self.assertEqual(audit["actions"][0]["status"], "succeeded")

    def test_a_gated_command_the_lead_rejects_never_runs_and_claude_is_told_why(self) -> None:
        model, project, agent = self.ask("toolu_01SdkReject")
        approval = waiting(self, "lin", lambda a: a.get("tool_use_id") == "toolu_01SdkReject")

        self.server.cli("review", "reject", approval["id"], "--as", "lin", "--reason", "the build directory is shared")
        self.assertIn("Done.", self.finished(agent))
        self.assertFalse((project / "out.txt").exists(), "the command never ran")
        [told] = model.tool_results()
        self.assertTrue(told["is_error"], told)
        self.assertIn("the build directory is shared", json.dumps(told))
        audit = json.loads(self.server.cli("audit", approval["id"], "--json"))
        self.assertEqual(audit["actions"][0]["status"], "rejected")
        self.assertNotIn("executed", [entry["event"] for entry in audit["entries"]])


if __name__ == "__main__":
    unittest.main()
