"""An eval harness that gives each task its own throwaway database.

For every task: fork a sandbox from the golden (`scratch_db`), hand the model a
`run_sql` tool bound to that sandbox — one `sql` property, no connection string —
run the model's tool calls, then grade the outcome with the harness's own queries
and `changes_since_fork`. The sandbox is deleted when the task ends, however it
ends; its TTL deletes it should the harness die.

The model here is a scripted stand-in so the example runs anywhere. To use a real
one, replace `ScriptedModel` with a loop over your SDK's tool calls, passing
`tool.anthropic` (Anthropic Messages), `tool.openai` (OpenAI Chat Completions) or
`tool.openai_responses` (OpenAI Responses) as the tool definition and sending back
`tool.call(arguments)["text"]` as the tool result.

    python3 examples/harness/agent_harness.py --golden shop
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable, Iterator, List

from airlock_client import Client, SqlTool, scratch_db, sql_tool


@dataclass
class Task:
    """One eval task: a prompt, and a check the harness runs on the database after."""

    id: str
    prompt: str
    check_sql: str
    expected: list


class ScriptedModel:
    """Stands in for a model: yields the tool calls a model might make for a task,
    the last of them reckless, as models sometimes are."""

    SCRIPTS = {
        "refund": [
            "SELECT count(*) FROM orders WHERE total > 400",
            "UPDATE orders SET total = 0, note = 'refunded' WHERE total > 400",
        ],
        "cleanup": [
            "SELECT count(*) FROM orders WHERE note IS NULL",
            "DELETE FROM orders",  # "just try it": gone from this sandbox only
        ],
    }

    def tool_calls(self, task: Task, tool_definition: dict) -> Iterator[dict]:
        assert list(tool_definition["input_schema"]["properties"]) == ["sql"]
        for sql in self.SCRIPTS[task.id]:
            yield {"sql": sql}


TASKS = [
    Task("refund", "Refund every order over 400.", "SELECT count(*) FROM orders WHERE note = 'refunded'", [[100]]),
    Task("cleanup", "Remove orders without a note.", "SELECT count(*) FROM orders", [[0]]),
]


def run_task(client: Client, golden: str, task: Task, model: ScriptedModel, log: Callable[[str], None]) -> dict:
    with scratch_db(golden, ttl="10m", labels={"task": task.id}, client=client) as sandbox:
        tool: SqlTool = sql_tool(client, sandbox)
        for arguments in model.tool_calls(task, tool.anthropic):
            out = tool.call(arguments)  # what the model would read next
            log(f"[{task.id}] run_sql {arguments['sql']!r} -> {out['text'].splitlines()[0]}")
        # Grading uses the harness's own access, not the model's transcript.
        got = client.sql(sandbox, task.check_sql)["rows"]
        changes = client.call_tool(sandbox, "changes_since_fork")["result"]
        return {
            "task": task.id,
            "passed": got == task.expected,
            "rows_changed": {r["table"]: r.get("rows") for r in changes["row_changes"]},
        }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", default="shop")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    client = Client()
    log = (lambda _: None) if args.json else print
    results = [run_task(client, args.golden, task, ScriptedModel(), log) for task in TASKS]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(f"{r['task']}: {'pass' if r['passed'] else 'FAIL'} (rows now: {r['rows_changed']})")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
