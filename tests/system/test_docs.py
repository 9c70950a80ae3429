"""The documentation a newcomer follows works as written (issue 19, part 8): the complete
configuration example in docs/configuration.md passes --check-config after the shell
block beside it, and nothing a user reads points outside the repository."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import fleet

ROOT = Path(os.environ.get("FLEETGATE_SOURCE_ROOT") or Path(__file__).resolve().parents[2])


def blocks_after(md, heading, lang):
    """The fenced blocks of language lang in the section that starts at heading."""
    text = md[md.index(heading):]
    nxt = re.search(r"\n## ", text[len(heading):])
    if nxt:
        text = text[:len(heading) + nxt.start()]
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


@pytest.mark.once
def test_the_complete_configuration_example_checks(tmp_path):
    md = (ROOT / "docs" / "configuration.md").read_text()
    [example] = blocks_after(md, "## A complete example", "json")
    [setup] = blocks_after(md, "## A complete example", "sh")
    (tmp_path / "gateway.json").write_text(example)
    # every secret the example names is one the block sets
    for var in re.findall(r'"\w*_env": "(\w+)"', example):
        assert f"export {var}=" in setup, f"the block does not set {var}"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "fleetgate").symlink_to(fleet.gateway_bin())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETGATE_", "PIXEL"))}
    env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    r = subprocess.run(["bash", "-e", "-c", setup], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == "", r.stderr
    # and without the variables it names what is missing, with positions
    r = subprocess.run([str(fleet.gateway_bin()), "--check-config", "gateway.json"], cwd=tmp_path,
                       env={k: v for k, v in env.items() if k != "PIXEL01_TOKEN"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "FLEETGATE_ADMIN_TOKEN" in r.stderr, r.stderr


def test_hash_key_refuses_an_argument_and_reads_stdin():
    r = subprocess.run([str(fleet.gateway_bin()), "--hash-key", "my-secret-key"], input="",
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "stdin" in r.stderr and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert "my-secret-key" not in r.stderr
    # echo with or without -n, and CRLF: the same line
    lines = {subprocess.run([str(fleet.gateway_bin()), "--hash-key"], input=k, capture_output=True,
                            text=True, timeout=10).stdout for k in ("abc", "abc\n", "abc\r\n")}
    assert lines == {'"key_sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"\n'}, lines


def test_check_config_no_files_checks_a_file_before_its_files_exist(tmp_path):
    """deploy.md checks the installed configuration before the certificate and data_dir
    exist: --no-files passes it and says what it left out; without the flag, or with a
    secret missing or a mistake in the file, the check fails as always."""
    src = json.loads((ROOT / "deploy/etc/gateway.json").read_text())
    (tmp_path / "replicas.d").mkdir()
    (tmp_path / "gateway.json").write_text(json.dumps(src, indent=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETGATE_")}
    run = lambda *a, e=None: subprocess.run([str(fleet.gateway_bin()), "--check-config", "gateway.json", *a],
                                            cwd=tmp_path, env=e or dict(env, FLEETGATE_ADMIN_TOKEN="0123456789abcdef0123"),
                                            capture_output=True, text=True, timeout=30)
    r = run()
    assert r.returncode == 1 and "tls/fullchain.pem" in r.stderr and "/var/lib/fleetgate" in r.stderr, r.stderr
    r = run("--no-files")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "gateway.json: ok (0 replicas)",
        "not checked (--no-files): 0.0.0.0:443's certificate tls/fullchain.pem and key tls/privkey.pem",
        "not checked (--no-files): data_dir /var/lib/fleetgate"], r.stdout
    r = run("--no-files", e=env)  # the admin token is still needed
    assert r.returncode == 1 and "FLEETGATE_ADMIN_TOKEN" in r.stderr, r.stderr
    src["queue"]["max"] = -5
    (tmp_path / "gateway.json").write_text(json.dumps(src, indent=1))
    r = run("--no-files")
    assert r.returncode == 1 and "queue.max" in r.stderr and "data_dir" not in r.stderr, r.stderr
    r = subprocess.run([str(fleet.gateway_bin()), "--config", "gateway.json", "--no-files"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--no-files goes with --check-config" in r.stderr, r.stderr


def user_facing_files():
    yield ROOT / "README.md"
    yield from (ROOT / "docs").glob("*.md")
    yield from (ROOT / "config").rglob("*.json")
    yield from (f for f in (ROOT / "deploy").rglob("*") if f.suffix in (".sh", ".md", ".json", ".example"))
    yield ROOT / "tests" / "system" / "fixtures" / "README.md"


@pytest.mark.once
def test_nothing_a_user_reads_points_outside_the_repository():
    bad = []
    for f in user_facing_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            # (docs/testing.md names where CI lays the real engine: a place to install to,
            # not something to read)
            if "shared/reference" in line or "/work/" in line:
                bad.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_a_reload_reads_the_environment_the_gateway_started_with(sim, gateway):
    """configuration.md, Reloading: a section added by a reload whose variable the process
    never had is refused, naming the variable (it takes a restart)."""
    import json  # noqa: PLC0415

    import gwutil as g  # noqa: PLC0415
    from test_admin import Admin, start  # noqa: PLC0415
    p1 = g.phone(sim, "p1")
    gw, admin = start(gateway, [g.replica(p1)])
    os.environ["FG_DOCS_SECRET"] = "exported-after-the-start-0123"  # not the gateway's
    try:
        cfg = json.loads(gw.config_path.read_text())
        cfg["fleet"] = {"secret_env": "FG_DOCS_SECRET"}
        gw.config_path.write_text(json.dumps(cfg))
        r = Admin(gw).post("/admin/v1/reload")
    finally:
        del os.environ["FG_DOCS_SECRET"]
    assert r.status_code == 422, r.text
    assert any("FG_DOCS_SECRET" in e for e in r.json()["errors"]), r.json()
