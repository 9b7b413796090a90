"""`make test-faults`: run the fault scenarios, print one line each and the table, write var/faults.json.

    python -m tests.faults                    # every scenario
    python -m tests.faults kill-leader ...    # only these
    python -m tests.faults --list

Needs root (network namespaces, mounts). Exit 0 when every check of every
scenario passed, 1 otherwise, 2 when the harness cannot run here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

from smartcache.devstack.stack import ROOT
from tests.faults.cluster import HOSTS, TTL_S
from tests.faults.harness import execute
from tests.faults.report import line, table
from tests.faults.scenarios import SCENARIOS
from tests.netns import NetnsError, Network


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _tarantool_version() -> str:
    out = subprocess.run(["tarantool", "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help="names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "var" / "faults.json", help="the JSON report; the table goes beside it (.md)"
    )
    args = parser.parse_args(argv)
    if args.out.suffix == ".md":
        parser.error(f"--out {args.out}: the JSON report's name (the Markdown table is written beside it as .md)")
    if args.list:
        for sc in SCENARIOS:
            print(f"{sc.name:28} {sc.summary}")
        return 0
    unknown = set(args.scenarios) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"no such scenario: {', '.join(sorted(unknown))}")
    chosen = [s for s in SCENARIOS if not args.scenarios or s.name in args.scenarios]
    if os.geteuid() != 0:
        print("test-faults needs root: network namespaces, tmpfs and loop mounts", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # the Tarantool connector warns on every lost connection: expected here
    signal.signal(signal.SIGTERM, _stop)
    base = args.out.parent / "faults"
    try:
        net = Network.create(HOSTS)
    except NetnsError as e:
        print(f"test-faults: cannot create network namespaces here: {e}", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for sc in chosen:
            print(f"== {sc.name}: {sc.summary}", flush=True)
            result = execute(sc, base / sc.name, net)
            results.append(result)
            print(line(result), flush=True)
            for c in result["checks"]:
                if not c["ok"]:
                    print(f"   FAILED: {c['name']}: {c['detail']}", flush=True)
            net.heal()
    finally:
        net.close()
    report = {
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, {platform.release()}",
        "tarantool": _tarantool_version(),
        "ttl_s": TTL_S,
        "partitions": "network namespaces (tests/netns.py), packets dropped on arrival by nftables",
        "duration_s": round(time.monotonic() - started, 1),
        "passed": all(r["passed"] for r in results),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = table(results)
    args.out.with_suffix(".md").write_text(text + "\n")
    print()
    print(text)
    print(f"\n{sum(r['passed'] for r in results)} of {len(results)} scenarios passed in {report['duration_s']} s")
    print(f"details: {args.out} (histories and logs: {base}/<scenario>/)")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
