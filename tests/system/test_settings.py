"""The configuration reference cannot drift from the loader: every table in
docs/configuration.md that lists a section's keys is exactly what `fleetgate
--print-settings` prints from the table gateway/config.c loads with (keys, types,
defaults, ranges, meanings), and the defaults it states are the ones a file without the
keys gets."""
import json
import subprocess

import fleet
from fleet import T

DOC = fleet.SOURCE_ROOT / "docs" / "configuration.md"
HEADER = "| key | type | default | range | meaning |"


def tables(lines, heading_of):
    """{section: [table lines]} for every heading heading_of() names a section."""
    out, sec = {}, None
    for line in lines:
        if line.startswith("#"):
            sec = heading_of(line)
            continue
        if sec is not None and line.startswith("|"):
            out.setdefault(sec, []).append(line)
        elif sec is not None and sec in out:
            sec = None  # the first table after the heading only
    return out


def printed():
    p = subprocess.run([fleet.gateway_bin(), "--print-settings"], capture_output=True,
                       text=True, timeout=T(10))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(not line.startswith("#") or line.startswith("### ") for line in lines), p.stdout
    return tables(lines, lambda h: "" if h == "### top level" else h[len("### `"):-1])


def documented():
    def section(h):
        if h == "## Keys":
            return ""
        if h.startswith("### `"):
            return h[len("### `"):].split("`")[0]
        return None
    return tables(DOC.read_text().splitlines(), section)


def test_docs_tables_are_the_settings_table():
    want, have = printed(), documented()
    assert len(want) >= 10 and "" in want and "replicas" in want, sorted(want)
    for sec, rows in want.items():
        assert rows[0] == HEADER, rows
        assert sec in have, f"docs/configuration.md has no table for `{sec or 'top level'}`"
        assert have[sec] == rows, (f"docs/configuration.md, `{sec or 'top level'}`: "
                                   "run `fleetgate --print-settings` and copy its table",
                                   [r for r in rows if r not in have[sec]],
                                   [r for r in have[sec] if r not in rows])
    # and no key table in the reference is for a section the loader does not have
    extra = [s for s, rows in have.items() if rows[0] == HEADER and s not in want]
    assert not extra, extra


def nest(sec, obj):
    """The config holding obj as section sec ("scheduler.device": inside "scheduler")."""
    for part in reversed(sec.split(".")):
        obj = {part: obj}
    return obj


def test_every_listed_key_is_known_and_no_other(tmp_path):
    """Each key the reference lists for a section is one --check-config knows (whatever
    else it says about the value), and any other key in that section is refused."""
    f = tmp_path / "c.json"

    def check(cfg):
        f.write_text(json.dumps(cfg))
        p = subprocess.run([fleet.gateway_bin(), "--check-config", str(f)], capture_output=True,
                           text=True, timeout=T(10))
        return p.stderr

    item = {"api_keys": {"name": "k", "key_sha256": "0" * 64},
            "models": {"name": "m"},
            "replicas": {"id": "r", "url": "https://h", "models": ["m"]}}
    for sec, rows in printed().items():
        for key in (r.split("`")[1] for r in rows[2:]):
            if sec == "":
                cfg = {key: None}
            elif sec in item:
                cfg = {sec: [dict(item[sec], **{key: None})]}
            elif sec.split(".")[0] in item:  # a section inside a list's entries
                top, sub = sec.split(".", 1)
                cfg = {top: [dict(item[top], **nest(sub, {key: None}))]}
            else:
                cfg = nest(sec, {key: None})
            err = check(cfg)
            assert "unknown key" not in err, (sec, key, err)
        if sec == "":
            cfg, where = {"not_a_key": 1}, "not_a_key"
        elif sec in item:
            cfg, where = {sec: [dict(item[sec], not_a_key=1)]}, f"{sec}[0].not_a_key"
        elif sec.split(".")[0] in item:
            top, sub = sec.split(".", 1)
            cfg = {top: [dict(item[top], **nest(sub, {"not_a_key": 1}))]}
            where = f"{top}[0].{sub}.not_a_key"
        else:
            cfg, where = nest(sec, {"not_a_key": 1}), f"{sec}.not_a_key"
        assert f"{where}: unknown key" in check(cfg), sec
