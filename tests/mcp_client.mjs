// A client of Countersign's MCP gateway on the official MCP TypeScript SDK
// (`@modelcontextprotocol/sdk`, the version tests/npm/servers/package-lock.json pins: the
// reference servers are built on it), for tests/mcp_gateway.rs: one session over stdio, its
// steps in order, one JSON line printed per step.
//
//     node mcp_client.mjs SDK_DIR STEPS COMMAND [ARG...]
//
// STEPS is a JSON list of tool calls:
//     {"tool": NAME, "args": {...}, "wait_seconds": N,   -> {"is_error", "text", "meta", "progress",
//      "timeout_ms": N, "reset_timeout_on_progress": B}     "elapsed_ms"}
// A call the SDK gives up on prints {"error": {"code", "message"}, "progress", "elapsed_ms"}.
// Every call asks for progress (`onprogress`), so it carries a progress token.

import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [sdk, steps, command, ...args] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(sdk, "dist/esm", path)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

// The server gets this process's whole environment: its state directory, its agents.
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" });
const client = new Client({ name: "countersign-tests", version: "1.0.0" });
await client.connect(transport);
for (const step of JSON.parse(steps)) {
  const progress = [];
  const options = {
    onprogress: (told) => progress.push(told),
    resetTimeoutOnProgress: step.reset_timeout_on_progress ?? false,
  };
  if (step.timeout_ms !== undefined) options.timeout = step.timeout_ms;
  const call = {
    name: step.tool,
    arguments: step.args ?? {},
    _meta: { "countersign/wait_seconds": step.wait_seconds },
  };
  const started = Date.now();
  let answer;
  try {
    const result = await client.callTool(call, undefined, options);
    answer = {
      is_error: result.isError ?? false,
      text: result.content.filter((b) => b.type === "text").map((b) => b.text).join("\n"),
      meta: result._meta ?? {},
    };
  } catch (error) {
    answer = { error: { code: error.code ?? null, message: String(error.message) } };
  }
  console.log(JSON.stringify({ ...answer, progress, elapsed_ms: Date.now() - started }));
}
await client.close();
