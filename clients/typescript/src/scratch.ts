/** `scratchDb`: a sandbox for the length of a callback. */

import { AirlockError, Client, type ForkOptions, type Sandbox } from "./client.js";

/**
 * Forks a sandbox from `golden`, runs `use` with it, and deletes it when
 * `use` settles, however it settles. Should the process die first, the
 * sandbox's TTL (15 minutes unless given) deletes it.
 */
export async function scratchDb<T>(
  golden: string,
  use: (sandbox: Sandbox) => Promise<T> | T,
  options: ForkOptions & { client?: Client } = {},
): Promise<T> {
  const { client = new Client(), ...fork } = options;
  const sandbox = await client.fork(golden, { ttl: "15m", ...fork });
  try {
    return await use(sandbox);
  } finally {
    try {
      await client.delete(sandbox);
    } catch (e) {
      // Already gone (its TTL, or the callback deleted it) is fine.
      if (!(e instanceof AirlockError && e.code === "sandbox_not_found")) throw e;
    }
  }
}
