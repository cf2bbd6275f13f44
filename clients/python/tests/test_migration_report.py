"""The migration report as documented: the JSON Schema published in docs/ is
the one `airlock migrate schema` prints, a real report from `migrate test`
holds to it with every field present, and so does the example in docs/.

Set AIRLOCK_WRITE_EXAMPLE=1 to write the real report as the docs' example."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "docs" / "migration-report.schema.json"
EXAMPLE = REPO / "docs" / "examples" / "migration-report.json"

CANDIDATES = {
    "add_note.sql": "SET lock_timeout = '2s';\nALTER TABLE customers ADD COLUMN note text;\n",
    "reprice.sql": "UPDATE orders SET total = 0;\n",
    "email_not_null_name.sql": "ALTER TABLE customers ALTER COLUMN name SET NOT NULL;\n"
    "UPDATE customers SET name = NULL WHERE id = 1;\n",
}


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problems(report: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(report)]


@pytest.fixture(scope="module")
def report(daemon, tmp_path_factory) -> dict:
    files = tmp_path_factory.mktemp("candidates")
    for name, text in CANDIDATES.items():
        (files / name).write_text(text)
    done = daemon.cli(
        "migrate", "test", "--golden", "shop", "--json", *[str(files / n) for n in CANDIDATES], check=False
    )
    assert done.returncode in (0, 12), f"{done.stdout} {done.stderr}"
    report = json.loads(done.stdout)
    if os.environ.get("AIRLOCK_WRITE_EXAMPLE"):
        EXAMPLE.parent.mkdir(exist_ok=True)
        EXAMPLE.write_text(json.dumps(report, indent=2) + "\n")
    return report


def test_the_published_schema_is_the_one_the_daemon_prints(daemon):
    printed = json.loads(daemon.cli("migrate", "schema").stdout)
    assert printed == json.loads(SCHEMA.read_text())


def test_a_real_report_holds_to_the_schema_with_every_field_present(report):
    assert problems(report) == []
    # Fields that are empty are still there: a script written from the docs
    # reads them without a guard.
    for candidate in report["candidates"]:
        for field in ("notes", "failure", "exec", "workload", "queries", "node", "parts", "hazards"):
            assert field in candidate, f"{candidate['name']} has no {field}"
        for statement in candidate["statements"]:
            for field in ("scanned", "indexes_built", "validated", "rolled_back", "tag"):
                assert field in statement, f"{candidate['name']} line {statement['line']} has no {field}"
    by_name = {c["name"]: c for c in report["candidates"]}
    assert by_name["add_note.sql"]["passed"] and by_name["add_note.sql"]["failure"] is None
    assert by_name["email_not_null_name.sql"]["failure"]["error"]["sqlstate"] == "23502"
    assert report["best"] == "add_note.sql" == report["ranking"][0]


def test_the_schema_refuses_a_report_that_leaves_a_field_out(report):
    for path in (("candidates", 0, "notes"), ("candidates", 0, "failure"), ("best",)):
        edited = copy.deepcopy(report)
        holder = edited
        for key in path[:-1]:
            holder = holder[key]
        del holder[path[-1]]
        assert problems(edited), f"a report without {'/'.join(map(str, path))} passed"


def test_the_documented_example_holds_to_the_schema():
    example = json.loads(EXAMPLE.read_text())
    assert problems(example) == []
    assert {c["name"] for c in example["candidates"]} == set(CANDIDATES)
