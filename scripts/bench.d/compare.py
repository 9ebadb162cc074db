#!/usr/bin/env python3
"""scripts/bench.d/compare.py PLAIN.md PGO.md: the targets of two scripts/bench reports side by
side, one row per target, each build's value and verdict (what `BOTH=1 scripts/bench` prints).

A target is a report line `- PASS: <what> — <value>` (or FAIL, SKIPPED), as scripts/bench and
the scripts it appends (bench-instructions, bench-resolution, bench-rtt, store-flood) write
them. Rows keep the first report's order; a target only one report has shows `—` for the other.
The last line counts each build's PASS and FAIL. Exit status 0; 1 on a missing or unreadable
report."""

import re
import sys

TARGET = re.compile(r"^- (PASS|FAIL|SKIPPED): (.+?) — (.+)$")


def targets(path):
    """The report's targets in order: (what, verdict, value)."""
    found = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            m = TARGET.match(line.rstrip("\n"))
            if m:
                found.append((m.group(2).strip(), m.group(1), m.group(3).strip()))
    return found


def table(plain, pgo):
    """Markdown lines: one row per target of either report, then the verdicts counted."""
    rows, order = {}, []
    for col, found in ((0, plain), (1, pgo)):
        for what, verdict, value in found:
            if what not in rows:
                rows[what] = [None, None]
                order.append(what)
            rows[what][col] = (verdict, value)
    cell = lambda c: "—" if c is None else f"{c[0]} {c[1]}"
    out = ["| target | plain release build | PGO build (the image's, `scripts/build`'s) |",
           "|---|---|---|"]
    out += [f"| {what} | {cell(rows[what][0])} | {cell(rows[what][1])} |" for what in order]
    count = lambda found, v: sum(1 for t in found if t[1] == v)
    out.append("")
    out.append(f"plain: {count(plain, 'PASS')} PASS, {count(plain, 'FAIL')} FAIL; "
               f"PGO: {count(pgo, 'PASS')} PASS, {count(pgo, 'FAIL')} FAIL")
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: scripts/bench.d/compare.py PLAIN.md PGO.md")
    try:
        plain, pgo = targets(sys.argv[1]), targets(sys.argv[2])
    except OSError as e:
        sys.exit(f"compare: {e}")
    print("\n".join(table(plain, pgo)))


if __name__ == "__main__":
    main()
