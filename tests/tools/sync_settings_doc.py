#!/usr/bin/python3
"""Copy the tables `fleetgate --print-settings` prints into docs/configuration.md, section
by section (the prose around them stays): run it after changing the settings table in
gateway/config.c; tests/system/test_settings.py checks that nobody forgot.
usage: tests/tools/sync_settings_doc.py BUILD/gateway/fleetgate [docs/configuration.md]"""
import re
import subprocess
import sys


def tables(text):
    """{section heading key: [table lines]} from --print-settings output."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^### (.*)$", line)
        if m:
            cur = m.group(1).strip()
            out[cur] = []
        elif cur and line.startswith("|"):
            out[cur].append(line)
    return out


def main():
    exe = sys.argv[1]
    doc = sys.argv[2] if len(sys.argv) > 2 else "docs/configuration.md"
    want = tables(subprocess.run([exe, "--print-settings"], check=True, capture_output=True,
                                 text=True).stdout)
    lines = open(doc).read().split("\n")
    out, i, cur = [], 0, None
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^### (`[^`]+`|top level)", line)
        if m:
            cur = m.group(1)
        if cur in want and line.startswith("| key |"):
            out.extend(want.pop(cur))
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            continue
        out.append(line)
        i += 1
    open(doc, "w").write("\n".join(out))
    if want:
        print("sections not found in the document:", ", ".join(want), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
