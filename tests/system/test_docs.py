"""The documentation a newcomer follows works as written (issue 19, part 8): the complete
configuration example in docs/configuration.md passes --check-config after the shell
block beside it, and nothing a user reads points outside the repository."""
import os
import re
import subprocess
from pathlib import Path

import fleet

ROOT = Path(os.environ.get("FLEETGATE_SOURCE_ROOT") or Path(__file__).resolve().parents[2])


def blocks_after(md, heading, lang):
    """The fenced blocks of language lang in the section that starts at heading."""
    text = md[md.index(heading):]
    nxt = re.search(r"\n## ", text[len(heading):])
    if nxt:
        text = text[:len(heading) + nxt.start()]
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


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
