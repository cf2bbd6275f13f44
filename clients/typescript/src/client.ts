/**
 * The REST client: fork, delete, extend, reset and run the agent tools, over the
 * daemon's unix socket or over TCP with a bearer token. Node's standard library
 * only; the types come from the daemon's OpenAPI document (`src/openapi.ts`).
 */

import * as http from "node:http";
import * as https from "node:https";
import * as os from "node:os";
import * as path from "node:path";

import type { components } from "./openapi.js";

type Schemas = components["schemas"];

/** A sandbox as the daemon describes it. `dsn`, `redis_url` and `mcp_url` are secrets: keep them in the harness. */
export type Sandbox = Schemas["ForkAnswer"];
/** The stable codes of Airlock's errors. */
export type ErrorCode = Schemas["ErrorCode"];
/** What a tool call returns: `text` is what a model should see. */
export type ToolOutput = Schemas["ToolOutput"];
/** An agent tool's name, description and input schema. */
export type ToolSpec = Schemas["ToolSpec"];
/** The access mode and limits a sandbox is forked with. */
export type Access = Schemas["Access"];
/** `run_sql`'s structured result: statements with their tags, the last result set, and `error` when PostgreSQL refused. */
export type SqlResult = Record<string, unknown>;

/** A failure the daemon reported, with its stable code, message and hint. */
export class AirlockError extends Error {
  readonly code: ErrorCode | string;
  readonly hint: string;
  readonly status: number;

  constructor(code: ErrorCode | string, message: string, hint = "", status = 0) {
    super(`${message} (${code})${hint ? `: ${hint}` : ""}`);
    this.name = "AirlockError";
    this.code = code;
    this.hint = hint;
    this.status = status;
  }
}

/** A duration: seconds, or a string such as `"90s"`, `"15m"` or `"1h30m"`. */
export type Ttl = number | string;

const UNITS: Record<string, number> = { ms: 0.001, s: 1, m: 60, h: 3600, d: 86400 };

/** Seconds from a number or a duration string. */
export function ttlSeconds(ttl: Ttl): number {
  if (typeof ttl === "number") {
    if (!(ttl > 0)) throw new AirlockError("invalid_ttl", `a TTL of ${ttl} is not positive`, "give seconds > 0 or '15m'");
    return Math.max(1, Math.floor(ttl));
  }
  const compact = ttl.replace(/\s/g, "");
  const parts = [...compact.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d)/g)];
  if (parts.length === 0 || parts.map((p) => p[0]).join("") !== compact) {
    throw new AirlockError("invalid_ttl", `cannot read the TTL ${JSON.stringify(ttl)}`, "give seconds, or a duration such as 90s, 15m or 1h30m");
  }
  const seconds = parts.reduce((sum, p) => sum + Number(p[1]) * (UNITS[p[2] ?? "s"] ?? 1), 0);
  return Math.max(1, Math.floor(seconds));
}

/** Where the client reaches the daemon. */
export interface ClientOptions {
  /** The daemon's unix socket (default: `$AIRLOCK_HOME/airlock.sock`). */
  socketPath?: string;
  /** `http://HOST:PORT` of a daemon serving `--tcp` (default: `$AIRLOCK_URL`). */
  url?: string;
  /** Its bearer token (default: `$AIRLOCK_TOKEN`). */
  token?: string;
  /** Milliseconds before a request is given up (default 120 000). */
  timeoutMs?: number;
}

/** How to fork. */
export interface ForkOptions {
  ttl?: Ttl;
  labels?: Record<string, string>;
  name?: string;
  mode?: "owner" | "readonly";
  /** Also mint a task-scoped MCP endpoint (`mcp_url`). */
  mcp?: boolean;
  /** Wait this long in the queue when the host is full. */
  wait?: Ttl;
}

function defaultHome(): string {
  if (process.env.AIRLOCK_HOME) return process.env.AIRLOCK_HOME;
  if (process.getuid?.() === 0) return "/var/lib/airlock";
  return path.join(os.homedir(), ".local", "share", "airlock");
}

type Key = string | { id: string };

function idOf(sandbox: Key): string {
  return encodeURIComponent(typeof sandbox === "string" ? sandbox : sandbox.id);
}

/**
 * A client of one Airlock daemon. With no options it uses `AIRLOCK_URL` and
 * `AIRLOCK_TOKEN` when set, else the local daemon's socket.
 */
export class Client {
  readonly #socketPath: string | undefined;
  readonly #url: URL | undefined;
  readonly #token: string | undefined;
  readonly #timeoutMs: number;

  constructor(options: ClientOptions = {}) {
    const url = options.url ?? (options.socketPath ? undefined : process.env.AIRLOCK_URL);
    this.#timeoutMs = options.timeoutMs ?? 120_000;
    if (url) {
      const parsed = new URL(url.includes("://") ? url : `http://${url}`);
      if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
        throw new AirlockError("invalid_request", `unsupported URL ${JSON.stringify(url)}`, "give http://HOST:PORT");
      }
      this.#url = parsed;
      this.#token = options.token ?? process.env.AIRLOCK_TOKEN;
      if (!this.#token) throw new AirlockError("unauthorized", "a daemon URL needs a bearer token", "pass token or set AIRLOCK_TOKEN");
    } else {
      this.#socketPath = options.socketPath ?? path.join(defaultHome(), "airlock.sock");
    }
  }

  /** Where it connects (never the token). */
  toString(): string {
    return `Client(${this.#socketPath ?? this.#url?.origin})`;
  }

  /** Forks a sandbox from `golden`. */
  async fork(golden: string, options: ForkOptions = {}): Promise<Sandbox> {
    const body: Schemas["ForkBody"] = {
      golden,
      labels: options.labels ?? {},
      mcp: options.mcp ?? false,
      access: { mode: options.mode ?? "owner" } as Access,
    };
    if (options.ttl !== undefined) body.ttl_seconds = ttlSeconds(options.ttl);
    if (options.wait !== undefined) body.wait_seconds = ttlSeconds(options.wait);
    if (options.name !== undefined) body.name = options.name;
    return this.request<Sandbox>("POST", "/v1/sandboxes", body);
  }

  /** The sandbox as it is now. */
  get(sandbox: Key): Promise<Sandbox> {
    return this.request("GET", `/v1/sandboxes/${idOf(sandbox)}`);
  }

  /** Deletes a sandbox, its data and its credential. */
  async delete(sandbox: Key): Promise<void> {
    await this.request("DELETE", `/v1/sandboxes/${idOf(sandbox)}`);
  }

  /** Makes the sandbox expire `ttl` from now. */
  extend(sandbox: Key, ttl: Ttl): Promise<Sandbox> {
    return this.request("POST", `/v1/sandboxes/${idOf(sandbox)}/extend`, { ttl_seconds: ttlSeconds(ttl) });
  }

  /** Puts the sandbox back to its golden's state, same id and credential. */
  reset(sandbox: Key): Promise<Sandbox> {
    return this.request("POST", `/v1/sandboxes/${idOf(sandbox)}/reset`);
  }

  /** Runs SQL as the agent would; the structured result (`error` set when PostgreSQL refused). */
  sql(sandbox: Key, sql: string): Promise<SqlResult> {
    return this.request("POST", `/v1/sandboxes/${idOf(sandbox)}/sql`, { sql });
  }

  /**
   * Runs one of the agent tools with a model's arguments as given. Arguments
   * the tool does not take come back as a tool error (`is_error`, with the text
   * the model should read), never as an exception.
   */
  callTool(sandbox: Key, tool: string, args: Record<string, unknown> = {}): Promise<ToolOutput> {
    return this.request("POST", `/v1/sandboxes/${idOf(sandbox)}/tools/${encodeURIComponent(tool)}`, args);
  }

  /** The agent tools' names, descriptions and input schemas. */
  tools(): Promise<ToolSpec[]> {
    return this.request("GET", "/v1/tools");
  }

  /** One request; the answer's JSON, or an {@link AirlockError}. */
  async request<T>(method: string, route: string, body?: unknown): Promise<T> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string> = {};
    if (payload) {
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = String(payload.length);
    }
    if (this.#token) headers.Authorization = `Bearer ${this.#token}`;
    const where = this.#socketPath ?? this.#url?.host ?? "";
    const options: http.RequestOptions = { method, path: route, headers, timeout: this.#timeoutMs };
    if (this.#socketPath) options.socketPath = this.#socketPath;
    else if (this.#url) {
      options.hostname = this.#url.hostname;
      options.port = this.#url.port;
    }
    const send = this.#url?.protocol === "https:" ? https.request : http.request;
    const { status, text } = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const req = send(options, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", reject);
      });
      req.on("timeout", () => req.destroy(new Error(`no answer within ${this.#timeoutMs} ms`)));
      req.on("error", (e) =>
        reject(
          new AirlockError(
            "daemon_unreachable",
            `cannot reach the Airlock daemon at ${where}: ${e.message}`,
            "start it with `airlock serve`, or check AIRLOCK_HOME / AIRLOCK_URL",
          ),
        ),
      );
      if (payload) req.write(payload);
      req.end();
    });
    let data: unknown = undefined;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        throw new AirlockError("internal", `the daemon answered ${status} with something not JSON`);
      }
    }
    if (status >= 400) {
      const e = (data ?? {}) as Partial<Schemas["Error"]>;
      throw new AirlockError(e.code ?? "internal", e.message ?? `HTTP ${status}`, e.hint ?? "", status);
    }
    return data as T;
  }
}
