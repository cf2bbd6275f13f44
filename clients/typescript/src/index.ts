/**
 * Airlock's client for TypeScript and JavaScript: throwaway PostgreSQL (and
 * Redis) sandboxes for agent tasks, forked from seeded goldens, and a
 * `run_sql` tool in the shapes agent SDKs take.
 *
 * ```ts
 * import { Client, scratchDb, sqlTool } from "airlock-client";
 * const client = new Client();
 * await scratchDb("shop", async (sandbox) => {
 *   const tool = await sqlTool(client, sandbox);
 *   const answer = await tool.call(modelArguments); // send answer.text back
 * }, { client });
 * ```
 */

export {
  AirlockError,
  Client,
  ttlSeconds,
  type Access,
  type ClientOptions,
  type ErrorCode,
  type ForkOptions,
  type Sandbox,
  type SqlResult,
  type ToolOutput,
  type ToolSpec,
  type Ttl,
} from "./client.js";
export { scratchDb } from "./scratch.js";
export { SqlTool, sqlTool, type InputSchema } from "./tool.js";
export type { components, paths } from "./openapi.js";
