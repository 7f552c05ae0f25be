"""A Claude Agent SDK agent whose permission prompts Countersign answers.

The SDK runs Claude Code's own loop, model and tools; each time Claude Code would ask before a
tool call, it asks ``can_use_tool`` instead. Here that callback hands the call to the gate of the
``claude-code`` agent (examples/claude-code): routine commands are allowed at once, risky ones
(``rm -r``, a push to main, ``terraform apply``...) wait for a lead, who decides from another
process. An approved call is claimed, so it is handed to Claude Code once, with the approved
version's arguments; a PostToolUse hook reports what it did, so the audit holds what ran.

    COUNTERSIGN_URL=http://127.0.0.1:8780 COUNTERSIGN_TOKEN=$(countersign token --as dev-bot) \
        python examples/python/claude_agent_sdk_agent.py "Clean the build and note it."

The SDK starts the ``claude`` it bundles, or the one ``CLAUDE_CLI`` names.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from claude_agent_sdk import (
    ClaudeAgentOptions,
    HookContext,
    HookMatcher,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    ToolPermissionContext,
    query,
)

from countersign import Gate, GateError, Outcome

AGENT = "claude-code"
#: Who claims the calls handed to the SDK and reports on them.
CLAIMANT = "claude-agent-sdk"

gate = Gate(os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8780"), os.environ["COUNTERSIGN_TOKEN"])
#: The gate's call for each tool_use_id handed to Claude Code, for its PostToolUse.
handed: dict[str, Outcome] = {}


async def can_use_tool(
    tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
) -> PermissionResultAllow | PermissionResultDeny:
    """Proposes the call through the gate and waits for its decision, as long as it takes."""
    call_id = context.tool_use_id or ""
    try:
        outcome = await asyncio.to_thread(gate.call, AGENT, tool_name, tool_input, call_id)
        if outcome.status == "approved" and outcome.claim is None:
            claimed = await asyncio.to_thread(gate.claim, outcome.id, CLAIMANT)
            handed[call_id] = claimed
            return PermissionResultAllow(updated_input=dict(claimed.args or tool_input))
    except GateError as refused:
        # Not listed, arguments off the tool's schema, a claim lost: a gate that cannot rule
        # never allows.
        return PermissionResultDeny(message=f"Countersign: {refused.message}")
    if outcome.claim is not None or outcome.ran:
        return PermissionResultDeny(message=f"Countersign: {call_id} was already handed over once; it does not run twice.")
    return PermissionResultDeny(message=f"Countersign: {outcome.message}")


async def report(event: Any, tool_use_id: str | None, context: HookContext) -> dict[str, Any]:
    """PostToolUse and PostToolUseFailure: reports what a call handed over did."""
    claimed = handed.pop(tool_use_id or "", None)
    if claimed is not None:
        if event["hook_event_name"] == "PostToolUse":
            status, result = "succeeded", event.get("tool_response")
        else:
            status, result = "failed", event.get("error")
        await asyncio.to_thread(gate.report, claimed.id, CLAIMANT, status, result)
    return {}


async def main(task: str) -> int:
    options = ClaudeAgentOptions(
        can_use_tool=can_use_tool,
        hooks={
            "PostToolUse": [HookMatcher(hooks=[report])],
            "PostToolUseFailure": [HookMatcher(hooks=[report])],
        },
        cli_path=os.environ.get("CLAUDE_CLI"),
    )
    async for message in query(prompt=prompt(task), options=options):
        if isinstance(message, ResultMessage):
            print(message.result)
            return 1 if message.is_error else 0
    return 1


async def prompt(task: str) -> Any:
    """The task as the SDK's streaming input, which ``can_use_tool`` needs."""
    yield {"type": "user", "message": {"role": "user", "content": task}}


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "Clean the build and note it.")))
