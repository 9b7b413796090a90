"""One line per scenario while it runs, one Markdown table at the end (the README's "Tested under faults")."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    "scenario",
    "ops ok / failed / unknown",
    "acked lost",
    "max writable",
    "longest write gap s",
    "recovery s",
    "result",
)


def _s(value: Any) -> str:
    return "—" if value is None else str(value)


def line(r: dict[str, Any]) -> str:
    ops = r["ops"]
    failed = [c["name"] for c in r["checks"] if not c["ok"]]
    return (
        f"{r['scenario']}: ops ok {ops['ok']} / failed {ops['fail']} / unknown {ops['unknown']}, "
        f"acknowledged lost {r['acknowledged_lost']}, max writable at once {_s(r['max_writable'])}, "
        f"longest write gap {_s(r['write_gap_s'])} s, recovery {_s(r['recovery_s'])} s "
        f"(from the {r['recovery_from']}) — {'PASS' if r['passed'] else 'FAIL (' + str(len(failed)) + ')'}"
    )


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        ops = r["ops"]
        recovery = _s(r["recovery_s"]) + (" (from repair)" if r["recovery_from"] == "repair" else "")
        cells = (
            r["scenario"],
            f"{ops['ok']} / {ops['fail']} / {ops['unknown']}",
            str(r["acknowledged_lost"]),
            _s(r["max_writable"]),
            _s(r["write_gap_s"]),
            recovery,
            "pass" if r["passed"] else "**FAIL**",
        )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
