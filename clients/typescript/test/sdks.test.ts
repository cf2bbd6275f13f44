// sqlTool's shapes given to the agent SDKs themselves (development
// dependencies only): the Vercel AI SDK's and the OpenAI Agents SDK's own
// tool loops call run_sql on a real sandbox, with a scripted model standing in
// for the provider; the Anthropic SDK sends the definition to a Messages API
// on loopback and hands back the model's tool_use input, which the tool runs.

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as http from "node:http";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import Anthropic from "@anthropic-ai/sdk";
import { Agent, run, tool as agentsTool, Usage, type Model, type ModelRequest, type ModelResponse } from "@openai/agents";
import { generateText, jsonSchema, stepCountIs, tool as aiTool } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { scratchDb, sqlTool, type SqlTool } from "../src/index.js";
import { Daemon, SHOP } from "./daemon.js";

const daemon = new Daemon();

before(async () => {
  await daemon.start();
  fs.writeFileSync(path.join(daemon.home, "shop.sql"), SHOP);
  daemon.cli("golden", "create", "shop", "--schema", path.join(daemon.home, "shop.sql"));
});

after(() => daemon.stop());

/** Runs `body` with a run_sql tool on a sandbox of its own, deleted after. */
function withTool(body: (tool: SqlTool) => Promise<void>): Promise<void> {
  const client = daemon.client();
  return scratchDb("shop", async (sb) => body(await sqlTool(client, sb)), { client });
}

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

describe("the Vercel AI SDK", () => {
  it("runs run_sql from tool(sqlTool.vercelAi(jsonSchema)) in generateText's loop", async () => {
    await withTool(async (sqlTool) => {
      const calls = [
        { sql: "DELETE FROM orders WHERE id > 400" },
        { sql: "SELECT count(*) FROM orders", host: "invented by the model" },
      ];
      // (The AI SDK passes input on unchecked against a JSON schema it is
      // given: the invented argument reaches the tool.)
      const model = new MockLanguageModelV3({
        doGenerate: [
          ...calls.map((input, i) => ({
            content: [{ type: "tool-call" as const, toolCallId: `call-${i}`, toolName: "run_sql", input: JSON.stringify(input) }],
            finishReason: { unified: "tool-calls" as const, raw: "tool_use" },
            usage,
            warnings: [],
          })),
          { content: [{ type: "text" as const, text: "done" }], finishReason: { unified: "stop" as const, raw: "stop" }, usage, warnings: [] },
        ],
      });
      const result = await generateText({
        model,
        tools: { run_sql: aiTool(sqlTool.vercelAi(jsonSchema)) },
        prompt: "trim the orders",
        stopWhen: stepCountIs(5),
      });
      assert.equal(result.text, "done");
      const outputs = result.steps.flatMap((s) => s.toolResults.map((r) => String(r.output)));
      assert.equal(outputs.length, 2, JSON.stringify(result.steps.map((s) => s.content)));
      assert.ok(outputs[0]?.includes("DELETE 100"), outputs[0]);
      // An invented argument is the model's to fix: a tool result it reads,
      // never an exception in the SDK's loop.
      assert.ok(outputs[1]?.includes('has no argument "host"') && outputs[1].includes("invalid_arguments"), outputs[1]);
      // The tool's definition as the SDK sent it to the model.
      const sent = model.doGenerateCalls[0]?.tools?.[0];
      assert.equal(sent?.name, "run_sql");
      assert.deepEqual(sent && "inputSchema" in sent ? sent.inputSchema : undefined, sqlTool.inputSchema);
      assert.deepEqual((await sqlTool.run("SELECT count(*) FROM orders")).rows, [[400]]);
    });
  });
});

/** A model for the Agents SDK that answers from a script, one response per turn. */
class ScriptedModel implements Model {
  requests: ModelRequest[] = [];
  constructor(private script: ModelResponse["output"][]) {}
  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const output = this.script.shift() ?? [];
    return { usage: new Usage(), output };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not streamed here");
  }
}

describe("the OpenAI Agents SDK", () => {
  it("runs run_sql from tool(sqlTool.openaiAgents) in an agent's run", async () => {
    await withTool(async (sqlTool) => {
      const model = new ScriptedModel([
        [{ type: "function_call", callId: "c1", name: "run_sql", arguments: JSON.stringify({ sql: "SELECT count(*) FROM customers" }), status: "completed" }],
        [{ type: "function_call", callId: "c2", name: "run_sql", arguments: JSON.stringify({ sql: "SELECT * FROM nope" }), status: "completed" }],
        [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "50 customers" }] }],
      ]);
      const agent = new Agent({ name: "analyst", instructions: "count", model, tools: [agentsTool(sqlTool.openaiAgents)] });
      const result = await run(agent, "how many customers?");
      assert.equal(result.finalOutput, "50 customers");
      const outputs = result.newItems
        .filter((i) => i.type === "tool_call_output_item")
        .map((i) => JSON.stringify(i.rawItem));
      assert.equal(outputs.length, 2, JSON.stringify(result.newItems.map((i) => i.type)));
      assert.ok(outputs[0]?.includes("[[50]]"), outputs[0]);
      // A failed statement is a tool result the agent reads, not a thrown run.
      assert.ok(outputs[1]?.includes("42P01"), outputs[1]);
      // The SDK sent the definition strict, with the schema as it is.
      const sent = model.requests[0]?.tools.find((t) => t.type === "function" && t.name === "run_sql");
      assert.ok(sent && sent.type === "function", JSON.stringify(model.requests[0]?.tools));
      assert.equal(sent.strict, true);
      assert.deepEqual(sent.parameters, sqlTool.inputSchema);
    });
  });
});

describe("the Anthropic SDK", () => {
  let server: http.Server;
  let bodies: unknown[] = [];
  let base = "";
  before(async () => {
    // The Messages API on loopback: it records what the SDK sends and answers
    // as the API does when the model calls a tool.
    server = http.createServer((req, res) => {
      let text = "";
      req.on("data", (c) => (text += c));
      req.on("end", () => {
        bodies.push(JSON.parse(text));
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify({
            id: "msg_1",
            type: "message",
            role: "assistant",
            model: "claude-test",
            content: [{ type: "tool_use", id: "toolu_1", name: "run_sql", input: { sql: "SELECT name FROM customers WHERE id = 7" } }],
            stop_reason: "tool_use",
            stop_sequence: null,
            usage: { input_tokens: 1, output_tokens: 1 },
          }),
        );
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address();
    base = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
  });
  after(() => server.close());

  it("sends tools: [sqlTool.anthropic] as the API takes it and runs the tool_use input", async () => {
    await withTool(async (sqlTool) => {
      const anthropic = new Anthropic({ apiKey: "test-key", baseURL: base, maxRetries: 0 });
      const tools: Anthropic.Messages.Tool[] = [sqlTool.anthropic];
      const message = await anthropic.messages.create({
        model: "claude-test",
        max_tokens: 256,
        tools,
        messages: [{ role: "user", content: "who is customer 7?" }],
      });
      const sent = bodies[0] as { tools: unknown[] };
      assert.deepEqual(sent.tools, [{ name: "run_sql", description: sqlTool.description, input_schema: sqlTool.inputSchema }]);
      const use = message.content.find((b) => b.type === "tool_use");
      assert.ok(use && use.type === "tool_use");
      const answer = await sqlTool.call(use.input);
      assert.equal(answer.is_error, false);
      // The customer's name is data from the database, inside the envelope.
      assert.ok(answer.text.includes("<untrusted-data-") && answer.text.includes("Ignore all previous instructions"), answer.text);
    });
  });
});
