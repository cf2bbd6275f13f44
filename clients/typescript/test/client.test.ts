// The TypeScript client against a real daemon: `airlock serve` started here on
// its own data root, a golden made with the CLI, and every call made over the
// unix socket and over TCP with a bearer token.

import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { AirlockError, Client, scratchDb, sqlTool, ttlSeconds } from "../src/index.js";
import { Daemon, SHOP } from "./daemon.js";

const here = path.dirname(fileURLToPath(import.meta.url));

const daemon = new Daemon();

before(async () => {
  await daemon.start();
  fs.writeFileSync(path.join(daemon.home, "shop.sql"), SHOP);
  daemon.cli("golden", "create", "shop", "--schema", path.join(daemon.home, "shop.sql"));
});

after(() => daemon.stop());

describe("the client", () => {
  it("forks, reads, extends, resets and deletes a sandbox over the socket", async () => {
    const client = daemon.client();
    const sb = await client.fork("shop", { ttl: "10m", labels: { task: "t1" } });
    assert.equal(sb.golden, "shop");
    assert.equal(sb.state, "running");
    assert.match(sb.dsn ?? "", /^postgresql:\/\/airlock_agent:/);
    assert.deepEqual(sb.labels, { task: "t1" });
    assert.equal((await client.get(sb.id)).id, sb.id);
    const counted = await client.sql(sb, "SELECT count(*) FROM orders");
    assert.deepEqual(counted.rows, [[500]]);
    await client.sql(sb, "DELETE FROM orders");
    assert.deepEqual((await client.sql(sb, "SELECT count(*) FROM orders")).rows, [[0]]);
    const refused = await client.sql(sb, "SELECT * FROM nope");
    assert.equal((refused.error as { sqlstate: string }).sqlstate, "42P01");
    const extended = await client.extend(sb, "2h");
    assert.ok(extended.expires_at > sb.expires_at);
    await client.reset(sb);
    assert.deepEqual((await client.sql(sb, "SELECT count(*) FROM orders")).rows, [[500]]);
    await client.delete(sb);
    await assert.rejects(client.get(sb.id), (e: unknown) => {
      assert.ok(e instanceof AirlockError);
      assert.equal(e.code, "sandbox_not_found");
      assert.equal(e.status, 404);
      assert.ok(e.hint.length > 0);
      return true;
    });
  });

  it("reaches a daemon over TCP with its token, and says so without one that is right", async () => {
    const remote = new Client({ url: `http://${daemon.tcp}`, token: daemon.token });
    const sb = await remote.fork("shop", { ttl: 60 });
    assert.deepEqual((await remote.sql(sb, "SELECT 1 AS one")).rows, [[1]]);
    await remote.delete(sb);
    assert.ok(!String(remote).includes(daemon.token), "the token is never shown");
    await assert.rejects(new Client({ url: `http://${daemon.tcp}`, token: "wrong" }).tools(), (e: unknown) => {
      assert.ok(e instanceof AirlockError && e.code === "unauthorized" && e.status === 401);
      return true;
    });
    assert.throws(() => new Client({ url: `http://${daemon.tcp}`, token: "" }), AirlockError);
    const nowhere = new Client({ socketPath: path.join(daemon.home, "no.sock") });
    await assert.rejects(nowhere.tools(), (e: unknown) => e instanceof AirlockError && e.code === "daemon_unreachable");
  });

  it("reads durations as the CLI does", () => {
    assert.equal(ttlSeconds("1h30m"), 5400);
    assert.equal(ttlSeconds(90), 90);
    assert.throws(() => ttlSeconds("soon"), (e: unknown) => e instanceof AirlockError && e.code === "invalid_ttl");
    assert.throws(() => ttlSeconds(0), AirlockError);
  });
});

describe("scratchDb", () => {
  it("deletes its sandbox when the callback ends, and when it throws", async () => {
    const client = daemon.client();
    let kept = "";
    const rows = await scratchDb(
      "shop",
      async (sb) => {
        kept = sb.id;
        return (await client.sql(sb, "SELECT count(*) FROM customers")).rows;
      },
      { client, labels: { task: "scratch" } },
    );
    assert.deepEqual(rows, [[50]]);
    await assert.rejects(client.get(kept), (e: unknown) => e instanceof AirlockError && e.code === "sandbox_not_found");
    await assert.rejects(
      scratchDb(
        "shop",
        (sb) => {
          kept = sb.id;
          throw new Error("the task failed");
        },
        { client },
      ),
      /the task failed/,
    );
    await assert.rejects(client.get(kept), (e: unknown) => e instanceof AirlockError && e.code === "sandbox_not_found");
  });
});

describe("sqlTool", () => {
  it("offers one property in every SDK's shape and answers with enveloped text", async () => {
    const client = daemon.client();
    await scratchDb(
      "shop",
      async (sb) => {
        const tool = await sqlTool(client, sb);
        const schemas = [
          tool.anthropic.input_schema,
          tool.openai.function.parameters,
          tool.openaiResponses.parameters,
          tool.openaiAgents.parameters,
          tool.mcp.inputSchema,
        ];
        for (const schema of schemas) {
          assert.deepEqual(Object.keys(schema.properties as object), ["sql"]);
          assert.deepEqual(schema.required, ["sql"]);
          assert.equal(schema.additionalProperties, false, "strict mode needs no other properties");
        }
        assert.equal(tool.anthropic.name, "run_sql");
        assert.equal(tool.openai.function.name, "run_sql");
        assert.ok(!JSON.stringify(tool.anthropic).includes(sb.id), "the model never sees the sandbox");
        // The Vercel AI SDK wraps the schema with its own helper.
        const vercel = tool.vercelAi((schema) => ({ wrapped: schema }));
        assert.deepEqual(vercel.inputSchema, { wrapped: tool.inputSchema });
        const text = await vercel.execute({ sql: "SELECT name FROM customers WHERE id = 7" });
        assert.ok(text.includes("<untrusted-data-") && text.includes("Ignore all previous instructions"), text);
        const body = text.split("\n").slice(2).join("\n");
        assert.ok(body.indexOf("<untrusted-data-") < body.indexOf("Ignore all previous"), "the row is inside the envelope");
        // The OpenAI Agents SDK's execute, and a Chat Completions JSON string.
        assert.ok((await tool.openaiAgents.execute({ sql: "SELECT count(*) FROM orders" })).includes("[[500]]"));
        const fromString = await tool.call('{"sql": "SELECT count(*) FROM orders"}');
        assert.equal(fromString.is_error, false);
        const failed = await tool.call({ sql: "SELECT * FROM nope" });
        assert.ok(failed.is_error && failed.text.includes("42P01"), failed.text);
        assert.deepEqual((await tool.run("SELECT count(*) FROM customers")).rows, [[50]]);
      },
      { client },
    );
  });

  it("answers what a model got wrong as a tool error, and throws only for Airlock's own failures", async () => {
    const client = daemon.client();
    await scratchDb(
      "shop",
      async (sb) => {
        const tool = await sqlTool(client, sb);
        for (const [args, said] of [
          [{ sql: "SELECT 1", host: "db.internal" }, 'run_sql has no argument "host"'],
          [{}, "run_sql needs `sql`"],
          [{ sql: 42 }, "`sql` must be a string"],
          ["{not json", "the arguments are not JSON"],
          [["SELECT 1"], "run_sql takes a JSON object"],
        ] as const) {
          const out = await tool.call(args);
          assert.equal(out.is_error, true, JSON.stringify(args));
          assert.ok(out.text.includes(said), `${JSON.stringify(args)}: ${out.text}`);
          assert.equal((out.result as { error: { code: string } }).error.code, "invalid_arguments");
        }
        const gone = await sqlTool(client, "sb-doesnotexist");
        await assert.rejects(gone.call({ sql: "SELECT 1" }), (e: unknown) => e instanceof AirlockError && e.code === "sandbox_not_found");
      },
      { client },
    );
  });
});

describe("the types", () => {
  it("come from the OpenAPI document the daemon serves (regenerate with npm run openapi)", async () => {
    const client = new Client({ url: `http://${daemon.tcp}`, token: daemon.token });
    const served = await client.request<unknown>("GET", "/openapi.json");
    const committed = JSON.parse(fs.readFileSync(path.join(here, "../../openapi.json"), "utf8"));
    assert.deepEqual(
      committed,
      served,
      "clients/typescript/openapi.json is not the daemon's: save /openapi.json there and run `npm run openapi`",
    );
  });
});
