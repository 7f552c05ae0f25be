"""A client of Countersign's MCP gateway on the official MCP Python SDK (`mcp` from PyPI), for
tests/mcp_gateway.rs: one session, a few steps, one JSON line printed (and flushed) per step.

    mcp_client.py STEPS stdio COMMAND [ARG...]   spawns COMMAND, talks over its stdin and stdout
    mcp_client.py STEPS http URL TOKEN           Streamable HTTP, with the bearer TOKEN

STEPS is a JSON list of steps:
    {"op": "list"}                                  -> {"tools": [{name, description, input_schema, annotations}]}
    {"op": "call", "tool": NAME, "args": {...},     -> {"is_error", "text", "content", "structured",
     "wait_seconds": N, "call_id": ID, "progress": true}    "meta", "progress"}

"text" joins the answer's text blocks; "content" is every block as sent, "structured" its
structuredContent (null without).

The first line says what the session negotiated: {"protocol_version", "server"}. A progress
notification is also printed as it comes, as {"event": "progress", ...}.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def emit(value):
    print(json.dumps(value), flush=True)


async def step(session, spec):
    if spec["op"] == "list":
        listed = await session.list_tools()
        return {
            "tools": [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                    "annotations": tool.annotations.model_dump(by_alias=True, exclude_none=True)
                    if tool.annotations
                    else None,
                }
                for tool in listed.tools
            ]
        }
    if spec["op"] == "call":
        meta = {}
        if "wait_seconds" in spec:
            meta["countersign/wait_seconds"] = spec["wait_seconds"]
        if "call_id" in spec:
            meta["countersign/call_id"] = spec["call_id"]
        progress = []

        async def on_progress(done, total, message):
            told = {"progress": done, "total": total, "message": message}
            progress.append(told)
            # Also at once, so a test can act while the call still waits.
            emit({"event": "progress", **told})

        result = await session.call_tool(
            spec["tool"],
            spec.get("args", {}),
            progress_callback=on_progress if spec.get("progress") else None,
            meta=meta or None,
        )
        return {
            "is_error": bool(result.is_error),
            "text": "\n".join(block.text for block in result.content if block.type == "text"),
            "content": [
                block.model_dump(by_alias=True, exclude_none=True, mode="json")
                for block in result.content
            ],
            "structured": result.structured_content,
            "meta": result.meta or {},
            "progress": progress,
        }
    raise ValueError(f"unknown step {spec}")


async def run(steps, session):
    initialized = await session.initialize()
    emit({"protocol_version": initialized.protocol_version, "server": initialized.server_info.name})
    for spec in steps:
        emit(await step(session, spec))


async def main(argv):
    steps = json.loads(argv[1])
    if argv[2] == "stdio":
        # The server gets this process's whole environment: its state directory, its agents.
        server = StdioServerParameters(command=argv[3], args=argv[4:], env=dict(os.environ))
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await run(steps, session)
    elif argv[2] == "http":
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {argv[4]}"})
        async with (
            client,
            streamable_http_client(argv[3], http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await run(steps, session)
    else:
        raise ValueError(f"unknown transport {argv[2]}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv))
