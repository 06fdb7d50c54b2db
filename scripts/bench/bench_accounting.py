"""Benchmark: what the per-stage accounting costs, this tree against an earlier one.

    git worktree add /tmp/before COMMIT   # e.g. the commit before the accounting
    python scripts/bench/bench_accounting.py SPEC.toml --before /tmp/before [--rounds 6]

Each round runs `bench`'s served measurement (`benchmark.served.bench_server`: a real
`input-server serve` process on a Unix socket, the client in another process) once with each
tree's code, in alternating order, in fresh processes. Printed as JSON: each tree's tokens/s and
server CPU ns a token per round, and the after/before ratios (median of the rounds' pairs).
A cost shows as server CPU a token going up and tokens/s going down.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Run in a fresh process whose path starts with one tree: its server and client.
MEASURE = """
import json, sys
from input_client.spec import PipelineSpec
from input_server.benchmark.served import bench_server
spec = PipelineSpec.from_toml(sys.argv[1])
r = bench_server(spec, "unix")
print(json.dumps({k: r[k] for k in ("tokens_per_s", "server_cpu_ns_per_token", "tokens")}))
"""


def measure(tree: str, spec: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([tree, os.path.join(tree, "client")])
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, spec],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(spec: str, before: str, after: str, rounds: int) -> dict:
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for which in order:
            runs[which].append(measure(before if which == "before" else after, spec))
            print(f"[bench_accounting] round {i + 1} {which}: {runs[which][-1]}", file=sys.stderr)

    def ratios(key: str) -> list[float]:
        return [a[key] / b[key] for a, b in zip(runs["after"], runs["before"], strict=True)]

    return {
        "spec": spec,
        "rounds": rounds,
        "runs": runs,
        "tokens_per_s_after_over_before": statistics.median(ratios("tokens_per_s")),
        "server_cpu_per_token_after_over_before": statistics.median(
            ratios("server_cpu_ns_per_token")
        ),
        "tokens_per_s_ratios": ratios("tokens_per_s"),
        "server_cpu_ratios": ratios("server_cpu_ns_per_token"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="pipeline spec TOML (a finite order: epochs >= 1)")
    parser.add_argument("--before", required=True, help="a checkout of the earlier commit")
    parser.add_argument("--after", default=ROOT, help="the tree measured against it (this one)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    result = run(os.path.abspath(args.spec), args.before, args.after, args.rounds)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
