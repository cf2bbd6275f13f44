/**
 * A ready `run_sql` tool for agent SDKs: the definition the model sees, with a
 * single `sql` property, and the callable the harness runs it with. The model
 * never sees or chooses the database; the tool is bound to one sandbox.
 */

import type { Client, Sandbox, SqlResult, ToolOutput } from "./client.js";

/**
 * The JSON schema of `run_sql`'s input, as the daemon gives it: an object
 * whose every property is required and which takes no other (what OpenAI's
 * strict mode and the Agents SDK need, and the Anthropic SDK takes).
 */
export type InputSchema = {
  type: "object";
  properties: Record<string, Record<string, unknown>>;
  required: string[];
  additionalProperties: false;
  [key: string]: unknown;
};

/** Whether `schema` is an {@link InputSchema}. */
function isInputSchema(schema: unknown): schema is InputSchema {
  const s = schema as Partial<InputSchema> | null;
  return (
    typeof s === "object" && s !== null && s.type === "object" && s.additionalProperties === false &&
    typeof s.properties === "object" && s.properties !== null && Array.isArray(s.required)
  );
}

/** `run_sql` bound to one sandbox, in the shapes agent SDKs take. */
export class SqlTool {
  readonly name = "run_sql";
  readonly description: string;
  readonly inputSchema: InputSchema;
  readonly #client: Client;
  readonly #sandbox: string;

  constructor(client: Client, sandbox: string | Sandbox, description: string, inputSchema: InputSchema) {
    this.#client = client;
    this.#sandbox = typeof sandbox === "string" ? sandbox : sandbox.id;
    this.description = description;
    this.inputSchema = inputSchema;
  }

  /**
   * Runs the tool with a model's arguments as given: `{is_error, result,
   * text}`, where `text` is what to send back to the model. Arguments the tool
   * does not take (an invented one, none, a wrong type) are a tool error whose
   * text says what to send, never an exception; only Airlock's own failures
   * (and a sandbox that is gone) throw.
   */
  async call(args: unknown): Promise<ToolOutput> {
    // OpenAI's APIs give a tool call's arguments as a JSON string.
    if (typeof args === "string") {
      try {
        args = JSON.parse(args);
      } catch {
        return refused("the arguments are not JSON", 'send a JSON object: {"sql": "SELECT ..."}');
      }
    }
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      return refused(`${this.name} takes a JSON object`, 'send {"sql": "SELECT ..."}');
    }
    return this.#client.callTool(this.#sandbox, this.name, args as Record<string, unknown>);
  }

  /** Runs `sql`; the text a model should read, errors included. */
  async text(sql: string): Promise<string> {
    return (await this.call({ sql })).text;
  }

  /** Runs `sql`; the structured result, for the harness (not the model). */
  run(sql: string): Promise<SqlResult> {
    return this.#client.sql(this.#sandbox, sql);
  }

  /** The definition for the Anthropic Messages API (`tools: [tool.anthropic]`); answer a `tool_use` block with `await tool.call(block.input)`. */
  get anthropic(): { name: string; description: string; input_schema: InputSchema } {
    return { name: this.name, description: this.description, input_schema: this.inputSchema };
  }

  /** The definition in OpenAI's Chat Completions `tools` shape. */
  get openai(): { type: "function"; function: { name: string; description: string; parameters: InputSchema } } {
    return { type: "function", function: { name: this.name, description: this.description, parameters: this.inputSchema } };
  }

  /** The definition in OpenAI's Responses API `tools` shape. */
  get openaiResponses(): { type: "function"; name: string; description: string; parameters: InputSchema; strict: boolean } {
    return { type: "function", name: this.name, description: this.description, parameters: this.inputSchema, strict: true };
  }

  /**
   * What the OpenAI Agents SDK's `tool()` takes: `tool(sqlTool.openaiAgents)`.
   * The schema is strict (every property required, no others).
   */
  get openaiAgents(): {
    name: string;
    description: string;
    parameters: InputSchema;
    strict: true;
    execute: (input: unknown) => Promise<string>;
  } {
    return {
      name: this.name,
      description: this.description,
      parameters: this.inputSchema,
      strict: true,
      execute: async (input: unknown) => (await this.call(input)).text,
    };
  }

  /**
   * What the Vercel AI SDK's `tool()` takes, given its `jsonSchema` helper:
   * `tools: { run_sql: tool(sqlTool.vercelAi(jsonSchema)) }`. (The helper is
   * the caller's, so this package depends on no SDK.)
   */
  vercelAi<S>(jsonSchema: (schema: InputSchema) => S): {
    description: string;
    inputSchema: S;
    parameters: S;
    execute: (input: unknown) => Promise<string>;
  } {
    const schema = jsonSchema(this.inputSchema);
    return {
      description: this.description,
      inputSchema: schema,
      parameters: schema,
      execute: async (input: unknown) => (await this.call(input)).text,
    };
  }

  /** The definition as MCP lists tools. */
  get mcp(): { name: string; description: string; inputSchema: InputSchema } {
    return { name: this.name, description: this.description, inputSchema: this.inputSchema };
  }
}

/** A tool error for arguments that never reached the daemon, in the daemon's shape. */
function refused(message: string, hint: string): ToolOutput {
  return {
    is_error: true,
    result: { error: { code: "invalid_arguments", message, hint } },
    text: `${message} (invalid_arguments). ${hint}`,
  };
}

/** A `run_sql` tool bound to `sandbox`, its definition read from the daemon. */
export async function sqlTool(client: Client, sandbox: string | Sandbox): Promise<SqlTool> {
  const spec = (await client.tools()).find((t) => t.name === "run_sql");
  if (!spec) throw new Error("the daemon offers no run_sql tool");
  if (!isInputSchema(spec.input_schema)) {
    throw new Error(`the daemon's run_sql input schema is not a strict object schema: ${JSON.stringify(spec.input_schema)}`);
  }
  return new SqlTool(client, sandbox, spec.description, spec.input_schema);
}
