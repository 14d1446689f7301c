"""Command line: python -m bench <name> [options] | all | list | table."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = ["dashboard", "allocator", "spawn", "metrics", "billing", "render", "estimate", "multihost"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help", "list"}:
        print("usage: python -m bench <name> [options] | all | table\nbenchmarks: " + ", ".join(BENCHMARKS))
        return 0
    name, rest = argv[0], argv[1:]
    if name == "table":  # the latest figures' table in bench/results/README.md, made again from the history
        from bench.report import write_table

        print(f"wrote {write_table()}")
        return 0
    names = BENCHMARKS if name == "all" else [name]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; choose from: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    for each in names:
        module = importlib.import_module(f"bench.{each}")
        parser = argparse.ArgumentParser(prog=f"python -m bench {each}", description=module.__doc__)
        module.add_arguments(parser)
        module.run(parser.parse_args(rest if name != "all" else []))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
