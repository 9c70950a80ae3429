"""The documentation a newcomer follows works as written (issue 19, part 8; issue 39):
every example of every page in docs/ and of the README is run here, as written, or
marked on its page as not run with the reason (docrun.py says how pages mark them, and
runs them in a sandbox with the demo's fixed ports); the complete configuration example
passes --check-config after the shell block beside it; --hash-key and --check-config
--no-files do what the pages say; and nothing a user reads points outside the
repository."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import docrun
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


# ---------------------------------------------------------------------------- every example

PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
# what a `running:` directive's command prints once it is up
READY = {"deploy/demo.sh --serve": "demo: serving until Ctrl-C"}
BLOCK_TIMEOUT = 600  # a release build (deploy.md) takes a minute alone, three on a loaded 2-core machine


def page(name):
    return docrun.parse(ROOT / name, name)


def needs_session(p):
    return any(isinstance(i, docrun.Directive) or
               (i.mark in ("output of", "file", "keeps running")) or
               (i.mark is None and i.lang in ("sh", "console", "js", "python"))
               for i in p.items)


@pytest.mark.once
def test_every_example_is_run_or_marked():
    """Every fenced block of every page is one the test runs or checks, or carries its
    reason for not running; an output follows something that ran."""
    problems = []
    for name in PAGES:
        p = page(name)
        problems += p.problems
        ran = False
        for b in p.items:
            if isinstance(b, docrun.Directive):
                continue
            if b.mark == "not run" and len(b.arg.split()) < 2:
                problems.append(f"{b.where()}: <!-- not run: … --> needs the reason (a few words)")
            if b.mark == "output" and not ran:
                problems.append(f"{b.where()}: <!-- output --> with no block run before it")
            if b.mark is None and b.lang not in docrun.RUN_LANGS:
                problems.append(f"{b.where()}: a ```{b.lang} block the test cannot run: mark it "
                                f"<!-- not run: WHY --> (or output, output of: CMD, file: NAME)")
            if b.mark != "output":  # an output after an output shows more of the same run
                ran = (b.mark is None and b.lang in ("sh", "console", "js", "python")) or \
                    (b.mark == "file" and b.lang in ("js", "python")) or b.mark in ("keeps running", "output of")
    assert not problems, "\n".join(problems)


@pytest.mark.once
def test_what_a_not_run_reason_names_is_there():
    """A reason that names what runs a block instead, or what the reader is sent to (a
    test, a script, a page), names files of the tree: a test renamed or a script moved
    leaves no reason pointing at nothing."""
    names = {f.name for top in ROOT.iterdir() if top.is_dir() and not top.name.startswith(("build", "."))
             for f in top.rglob("*") if f.is_file()} | {f.name for f in ROOT.iterdir() if f.is_file()}
    bad = []
    for name in PAGES:
        for b in page(name).blocks():
            if b.mark != "not run":
                continue
            for f in re.findall(r"[\w./-]+\.(?:py|sh|md|mjs|json)\b", b.arg):
                if not ((ROOT / f).exists() if "/" in f else f in names):
                    bad.append(f"{b.where()}: the reason names {f}, which is not in the tree")
    assert not bad, "\n".join(bad)


@pytest.mark.once
def test_python_examples_import_what_they_use():
    """Every Python example, run here or not, parses and uses no name it did not import
    or define (pyflakes: `time.sleep` without `import time` fails)."""
    fleet.need_tool("pyflakes", "apt-get install python3-pyflakes (deploy/setup.sh --test)",
                    found=subprocess.run(["/usr/bin/python3", "-m", "pyflakes", "--version"],
                                         capture_output=True).returncode == 0 or None)
    bad = []
    for name in PAGES:
        for b in page(name).blocks():
            if b.lang != "python":
                continue
            r = subprocess.run(["/usr/bin/python3", "-m", "pyflakes"], input=b.text,
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
                bad.append(f"{b.where()}:\n{r.stdout}{r.stderr}")
    assert not bad, "\n".join(bad)


@pytest.mark.once
def test_every_json_example_parses():
    """Every ```json block, run or not (an answer, a log line, a file the test cannot
    make), is JSON: one value, values one after the other, or a fragment of an object
    (`"key": value`); `…` or `...` outside a string is what the page leaves out
    (docrun.drop_elisions), anything else that is not JSON fails."""
    elided = '{"a": 1, "day": {…the same…}, "n": …, "l": [1, ...], "s": "x…"}\n{"b": 2} …'
    assert docrun.parse_json_block(elided) == [{"a": 1, "day": {}, "n": None, "l": [1], "s": "x…"}, {"b": 2}]
    for wrong in ('{"a": 1 "b": 2, …}', '{"a": 1}\n{"b": 2,}', '"listen": "x",\n"b": [1 2]'):
        with pytest.raises(json.JSONDecodeError):
            docrun.parse_json_block(wrong)
    bad = []
    for name in PAGES:
        for b in page(name).blocks():
            if b.lang != "json":
                continue
            try:
                docrun.parse_json_block(b.text)
            except json.JSONDecodeError as e:
                bad.append(f"{b.page}:{b.line + e.lineno}:{e.colno}: not JSON ({e.msg}), in the block of line {b.line}")
    assert not bad, "\n".join(bad)


def test_json_outputs_compare_keys_or_values(tmp_path):
    """The runner's comparison of a JSON output (no sandbox): keys only under `output`;
    under `output, values compared` each value shown is one of the output's, every key
    with its value (… a pattern), and a changed value fails."""
    ran = ('{"id":"phone-2","state":"ready","source":"heartbeat","url":"http://127.0.0.1:17202"}\n'
           '{"id":"phone-1","state":"ready","source":"heartbeat","url":"http://127.0.0.1:17201","n":[1,2]}\n')
    shown = '{"id":"phone-1","state":"ready","source":"heartbeat","url":"http://127.0.0.1:17201"}\n'
    assert docrun.compare_output(shown, ran, values=True) is None
    assert docrun.compare_output('{"id":"phone-…","n":[2]}', ran, values=True) is None
    down = shown.replace('"ready"', '"down"')
    assert docrun.compare_output(down, ran) is None  # keys only
    what = docrun.compare_output(down, ran, values=True)
    assert what and ".state: 'ready', not 'down'" in what, what
    assert docrun.compare_output('{"id":"phone-1","n":[3]}', ran, values=True)
    assert docrun.compare_output('{"id":"phone-1","port":17201}', ran, values=True)
    assert docrun.compare_output('{"n":1}', '{"n":true}', values=True)
    assert docrun.compare_output('{"n":1}', '{"n":1.0}', values=True) is None
    # and the marks as a page writes them
    md = tmp_path / "marks.md"
    md.write_text("<!-- output, values compared -->\n```json\n{}\n```\n<!-- output -->\n```json\n{}\n```\n")
    assert [(b.mark, b.arg) for b in docrun.parse(md, "marks.md").blocks()] == \
        [("output", "values compared"), ("output", None)]


def fragment_config(text, folder):
    """A configuration fragment as a file the gateway can load: a lone `"key": value` is
    wrapped in braces, a file without listeners listens on a free port; the secrets it
    names are set (dummy values, long enough) and the folders it names relative to it
    made. Returns (path, env)."""
    t = text.strip()
    cfg = json.loads(t if t.startswith("{") else "{" + t + "}")
    cfg.setdefault("listen", "127.0.0.1:0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETGATE_")}
    for var in re.findall(r'"\w*_env"\s*:\s*"(\w+)"', t):
        env[var] = f"docs-example-{var}-{os.urandom(16).hex()}"
    if isinstance(cfg.get("replicas_dir"), str):
        (folder / cfg["replicas_dir"]).mkdir(parents=True, exist_ok=True)
    path = folder / "fragment.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path, env


@pytest.mark.once
def test_configuration_fragments_check(tmp_path):
    """Every unmarked ```json block is a piece of the gateway's configuration that
    `fleetgate --check-config --no-files` accepts (with its secrets set)."""
    bad = []
    for name in PAGES:
        for b in page(name).blocks():
            if b.lang != "json" or b.mark is not None:
                continue
            folder = tmp_path / f"{name.replace('/', '_')}-{b.line}"
            folder.mkdir()
            try:
                path, env = fragment_config(b.text, folder)
            except ValueError as e:
                bad.append(f"{b.where()}: not JSON ({e}); mark it if it is not a configuration")
                continue
            r = subprocess.run([fleet.gateway_bin(), "--check-config", str(path), "--no-files"], cwd=folder,
                               env=env, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                bad.append(f"{b.where()}:\n{r.stderr}")
    assert not bad, "\n".join(bad)


def start_sandbox(folder):
    """The sandbox a page's examples run in (docrun.Sandbox); skips, or fails under
    CI=true, where namespaces cannot be made."""
    for tool in ("unshare", "nsenter", "ip", "findmnt"):
        fleet.need_tool(tool, "apt-get install util-linux iproute2 (a Debian system has them)",
                        found=docrun.which(tool))
    try:
        return docrun.Sandbox(folder, ROOT)
    except docrun.SandboxError as e:
        fleet.need_tool("namespaces (unshare --mount --net --pid, overlayfs)",
                        f"the docs' examples run in a sandbox of their own: {e}", found=False)


def run_page(p, folder):
    """Run page p's examples in order in a sandbox; the list of what went wrong."""
    box = start_sandbox(folder)
    failures = []
    sh = None
    try:
        sh = docrun.Session(box, ROOT, "/tmp/.fgdocs/first")
        prep = sh.run(
            "mkdir -p /tmp/.fgdocs/first /tmp/.fgdocs/last\n"
            # the reader's editor: the test keeps the file as shipped
            "printf '#!/bin/sh\\nexit 0\\n' > /tmp/.fgdocs/first/editor && chmod +x /tmp/.fgdocs/first/editor\n"
            f"ln -s {fleet.gateway_bin()} /tmp/.fgdocs/last/fleetgate\n"
            f"ln -s {fleet.agent_bin()} /tmp/.fgdocs/last/fleetgate-agent\n"
            "export PATH=$PATH:/tmp/.fgdocs/last\n"
            # `npm install openai` in the reader's folder
            + (f"ln -sfn {docrun_node()} node_modules\n" if any(b.lang == "js" and docrun.runs(b) for b in p.blocks()) else ""))
        if prep.errors or not prep.finished:
            return [f"the sandbox's session did not start: {prep.both}"]
        last = None
        n_running = 0
        for k, it in enumerate(p.items):
            shown = k + 1 < len(p.items) and getattr(p.items[k + 1], "mark", None) == "output"
            if isinstance(it, docrun.Directive):
                n_running += 1
                log = f"/tmp/.fgdocs/running-{n_running}.log"
                want = READY.get(it.cmd)
                wait = (f"for i in $(seq 1 900); do grep -q '{want}' {log} && break; kill -0 $! 2>/dev/null || break; "
                        f"sleep 0.1; done\ngrep -q '{want}' {log} || {{ cat {log}; false; }}\n") if want else \
                    f"sleep 2; kill -0 $! || {{ cat {log}; false; }}\n"
                # (disowned: the page's own jobs are %1, %2, … as in the reader's terminal)
                r = sh.run(f"{it.cmd} > {log} 2>&1 &\ndisown\n{wait}", timeout=BLOCK_TIMEOUT)
                if r.errors or not r.finished:
                    failures.append(f"{it.page}:{it.line}: `{it.cmd}` did not come up:\n{r.both}")
                    break
                continue
            b = it
            what = None
            if b.mark == "not run" or (b.mark is None and b.lang == "json"):
                continue  # json: test_configuration_fragments_check
            if b.mark == "file" and b.lang not in ("js", "python"):  # (a program's file: run below)
                r = sh.write(b.arg, b.text)
                if r.errors:
                    what = f"cannot write {b.arg}: {r.both}"
            elif b.mark == "output":
                if last is None:
                    what = "an output with nothing run before it"
                else:
                    what = docrun.compare_output(b.text, last(), values=b.arg == "values compared")
            elif b.mark == "output of":
                r = sh.run(b.arg + "\n", timeout=BLOCK_TIMEOUT)
                what = (f"`{b.arg}` failed:\n{r.both}" if r.errors or not r.finished
                        else docrun.compare_output(b.text, r.out))
            elif b.mark == "keeps running":
                n_running += 1
                log = f"/tmp/.fgdocs/running-{n_running}.log"
                sh.write(f"/tmp/.fgdocs/keep-{b.line}.sh", b.text)
                r = sh.run(f"( source /tmp/.fgdocs/keep-{b.line}.sh ) > {log} 2>&1 &\ndisown\n"
                           f"sleep 1; kill -0 $! || {{ cat {log}; false; }}\n")
                if r.errors or not r.finished:
                    what = f"it stopped at once:\n{r.both}"
                last = (lambda log=log: sh.run(f"sleep 0.5; cat {log}\n").out)
            elif b.lang == "console":
                for step in docrun.console_steps(b.text):
                    if step[0] == "write":
                        sh.write(step[1], step[2])
                        continue
                    r = sh.run(step[1] + "\n", timeout=BLOCK_TIMEOUT)
                    got = [l for l in (r.err + r.out).splitlines() if l.strip() and not l.startswith("FG-ERR")]
                    want = [l for l in step[2] if l.strip()]
                    if got != want:
                        what = f"`{step[1]}` printed\n" + "\n".join(got) + "\nnot\n" + "\n".join(want)
                        break
                last = None
            elif b.lang in ("sh", "js", "python") and b.mark in (None, "file"):
                if b.lang == "sh":
                    r = sh.run(b.text, timeout=BLOCK_TIMEOUT)
                else:
                    name = b.arg or f"example-{b.line}.{'mjs' if b.lang == 'js' else 'py'}"
                    sh.write(name, b.text)
                    r = sh.run(f"timeout {BLOCK_TIMEOUT} {'node' if b.lang == 'js' else 'python3'} {name}\n",
                               timeout=BLOCK_TIMEOUT + 10)
                if not r.finished:
                    what = f"did not finish (or ended the shell):\n{r.both}"
                elif r.errors:
                    what = f"{r.errors} command(s) failed:\n{r.both}"
                elif not shown and any(isinstance(v, dict) and "error" in v for v in docrun.json_values(r.out)):
                    # (curl says nothing of an HTTP error: the answer's OpenAI error shape does)
                    what = f"it was answered with an error:\n{r.both}"
                last = (lambda r=r: r.both)
            if what:
                failures.append(f"{b.where()} ```{b.lang}:\n{b.text}\n--> {what}")
                if "did not finish" in what or sh.proc.poll() is not None:
                    break  # the session is stuck or gone: what follows would fail for it
    finally:
        if sh:
            sh.close()
        box.close()
    return failures


def docrun_node():
    return fleet.need_node_openai() / "node_modules"


@pytest.mark.once
@pytest.mark.parametrize("name", [n for n in PAGES if needs_session(page(n))])
def test_the_pages_examples_run_as_written(name, tmp_path):
    """Each page's examples, in order, in a sandbox: the shell blocks, the console
    transcripts, the Node and Python snippets, files and outputs, with the demo running
    where the page says so."""
    p = page(name)
    for tool in ("curl", "openssl", "jq"):
        fleet.need_tool(tool, "deploy/setup.sh installs it")
    failures = run_page(p, tmp_path)
    assert not failures, "\n\n".join(failures)


@pytest.mark.once
def test_a_broken_example_fails(tmp_path):
    """The runner itself: a page whose example prints something else than its output
    shows, whose command fails, or which uses a variable it never set, fails; one that
    works passes."""
    page_md = tmp_path / "broken.md"
    page_md.write_text("\n".join([
        "```sh", "n=41; echo $((n + 1))", "```", "<!-- output -->", "```text", "42", "```",
        "```sh", "echo $((n + 1))", "```", "<!-- output -->", "```text", "43", "```",
        "```sh", "ls /no/such/folder", "echo 'the next line still runs'", "```",
        "```sh", "echo $NEVER_SET", "```",
        "```sh", "echo not reached", "```", ""]))
    p = docrun.parse(page_md, "broken.md")
    (tmp_path / "box").mkdir()
    failures = run_page(p, tmp_path / "box")
    assert len(failures) == 3, "\n\n".join(failures)
    assert failures[0].startswith("broken.md:12 ") and "no line like '43'" in failures[0], failures[0]
    assert failures[1].startswith("broken.md:15 ") and "1 command(s) failed" in failures[1], failures[1]
    assert "the next line still runs" in failures[1], failures[1]
    assert failures[2].startswith("broken.md:19 ") and "NEVER_SET: unbound variable" in failures[2], failures[2]
