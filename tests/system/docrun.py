"""Running the documentation's examples as written (test_docs.py, issue 39).

A page is read into its fenced blocks, each with the mark right before it, and the
directives between them:

    <!-- not run: REASON -->   the block is not run here, and why (a real account, a phone)
    <!-- output -->            what the block before it printed: compared with what it did
    <!-- output, values compared -->  the same, and the values of its JSON too (each
                               value shown is one of the output's, with all it shows)
    <!-- output of: COMMAND --> what COMMAND prints: it is run, and compared
    <!-- file: NAME -->        the block is a file the next blocks use: written to NAME (a
                               js or python one is then run as `node NAME`, `python3 NAME`)
    <!-- keeps running -->     a command that serves until stopped: started, left running
    <!-- running: COMMAND -->  (a directive, anywhere) the page's examples need COMMAND
                               running from here on: started in the background

Unmarked blocks run: `sh` in one shell session per page (variables, the folder and
background jobs carry over from block to block, as in a reader's terminal), `console`
transcripts command by command with their output compared, `js` with node, `python` with
python3 (after pyflakes), and `json` is a configuration fragment that
`fleetgate --check-config --no-files` must accept.

The session runs in a sandbox: its own network namespace (the fixed ports the docs use,
8080, 8443, 9090, are its own), its own process namespace (everything it starts ends
with it) and mount namespace, where the source tree, /etc, /usr, /var, /root and /opt
are overlays whose changes go to the test's folder and /tmp is empty: `meson install`,
`systemd-sysusers` and `cp … /etc/fleetgate/…` run as written and touch nothing of the
machine. FLEETGATE_DOCS_TIMES=1 prints each block's time on stderr."""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
COMMENT = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
MARKS = (("not run", re.compile(r"not run:\s*(.*)")), ("output of", re.compile(r"output of:\s*(.+)")),
         ("output", re.compile(r"output(?:,\s*(values compared))?$")), ("file", re.compile(r"file:\s*(\S+)$")),
         ("keeps running", re.compile(r"keeps running$")))
DIRECTIVE = re.compile(r"running:\s*(.+)")
RUN_LANGS = ("sh", "console", "js", "python", "json")


@dataclass
class Block:
    page: str
    line: int          # the opening fence's line (1-based)
    lang: str
    text: str          # dedented by the fence's indentation
    mark: str = None   # one of MARKS' names, or None
    arg: str = None

    def where(self):
        return f"{self.page}:{self.line}"


@dataclass
class Directive:
    page: str
    line: int
    cmd: str


@dataclass
class Page:
    name: str
    items: list = field(default_factory=list)
    problems: list = field(default_factory=list)  # marks it cannot have

    def blocks(self):
        return [b for b in self.items if isinstance(b, Block)]


def parse(path, name):
    """The page's blocks and directives, in order."""
    page = Page(name)
    lines = Path(path).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        c = COMMENT.match(lines[i])
        if c and DIRECTIVE.fullmatch(c.group(1)):
            page.items.append(Directive(name, i + 1, DIRECTIVE.fullmatch(c.group(1)).group(1).strip()))
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1:j]) + "\n"
        b = Block(name, i + 1, lang, body)
        prev = COMMENT.match(lines[i - 1]) if i > 0 else None
        if prev and not DIRECTIVE.fullmatch(prev.group(1)):
            for kind, rx in MARKS:
                mm = rx.fullmatch(prev.group(1))
                if mm:
                    b.mark, b.arg = kind, (mm.group(1) or "").strip() or None if mm.groups() else None
                    break
            else:
                page.problems.append(f"{b.where()}: unknown mark <!-- {prev.group(1)} --> "
                                     f"(not run: WHY | output | output, values compared | output of: CMD | file: NAME | "
                                     f"keeps running)")
        page.items.append(b)
        i = j + 1
    return page


def runs(b):
    """Whether block b is run (or checked against what runs) rather than marked not run."""
    return b.mark != "not run"


# ---------------------------------------------------------------------------- comparing

PLACEHOLDER = re.compile(r"…|\.\.\.|<[^<>\s][^<>]*>")


def json_values(text):
    """Every JSON object or array in text: the whole of it, or each one found in it (lines
    of JSON, SSE events, answers printed one after the other without a newline)."""
    try:
        return [json.loads(text)]
    except ValueError:
        pass
    out, dec, i = [], json.JSONDecoder(), 0
    while True:
        m = re.compile(r"[{\[]").search(text, i)
        if not m:
            return out
        try:
            v, end = dec.raw_decode(text, m.start())
        except ValueError:
            i = m.start() + 1
            continue
        if isinstance(v, (dict, list)):
            out.append(v)
        i = end


# a string (kept as it is), or an elision outside strings: `…words…`, `…` or `...`
JSON_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|…[^…"\n{}\[\]]*…|…|\.\.\.')


def drop_elisions(text):
    """text with the elisions outside its strings taken out (`…`, `...`, `…words…`: what
    a page leaves out of an object or a list), and the comma or value that went with them:
    `{"a": 1, …}` is `{"a": 1}`, `"day": {…the same…}` is `"day": {}`, `"n": …` is
    `"n": null`."""
    out = JSON_TOKEN.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "\0", text)
    out = re.sub(r":\s*\0", ": null", out)
    out = re.sub(r",\s*\0", "", out)
    out = re.sub(r"\0\s*,", "", out)
    return out.replace("\0", "")


def parse_json_block(text):
    """A ```json block's values: one JSON value, several one after the other (JSON lines,
    log lines), or a fragment of an object (`"key": value, …`, as configuration pages
    show them); elisions taken out first (drop_elisions). Raises ValueError (a
    json.JSONDecodeError, its lineno counted in text, elisions dropped) where it is none
    of those."""
    t = drop_elisions(text)
    try:
        return [json.loads(t)]
    except ValueError:
        pass
    if t.lstrip().startswith('"'):
        # a fragment: its error placed in text (the brace added before it is on line 1)
        try:
            return [json.loads("{" + t + "}")]
        except json.JSONDecodeError as e:
            raise json.JSONDecodeError(e.msg, t, max(e.pos - 1, 0)) from None
    out, dec, i = [], json.JSONDecoder(), 0
    while True:
        while i < len(t) and t[i].isspace():
            i += 1
        if i == len(t):
            return out
        v, i = dec.raw_decode(t, i)
        out.append(v)


def keys_of(v, acc=None):
    acc = set() if acc is None else acc
    if isinstance(v, dict):
        for k, x in v.items():
            acc.add(k)
            keys_of(x, acc)
    elif isinstance(v, list):
        for x in v:
            keys_of(x, acc)
    return acc


def missing_in(doc, real, path=""):
    """Keys of doc (parsed JSON) that real lacks, as paths; a list compares its first
    element with each of real's (none to compare when real's is empty)."""
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            return [path or "."] if real is not None else []
        out = []
        for k, v in doc.items():
            out += [f"{path}.{k}"] if k not in real else missing_in(v, real[k], f"{path}.{k}")
        return out
    if isinstance(doc, list) and doc and isinstance(real, list) and real:
        best = None
        for r in real:
            m = missing_in(doc[0], r, path + "[]")
            if best is None or len(m) < len(best):
                best = m
        return best
    return []


def like(shown):
    """A doc's text as a pattern: … and <…> stand for anything."""
    return re.compile(".*".join(re.escape(p) for p in PLACEHOLDER.split(shown)), re.S)


def unlike(doc, real, path=""):
    """Where real (parsed JSON) differs from doc, as paths: every key doc has, real has with
    the same value (a string with … or <…> is a pattern, as in text); a list's elements
    are each like one of real's."""
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            return [f"{path or '.'} (not an object)"]
        out = []
        for k, v in doc.items():
            out += [f"{path}.{k} (missing)"] if k not in real else unlike(v, real[k], f"{path}.{k}")
        return out
    if isinstance(doc, list):
        if not isinstance(real, list):
            return [f"{path or '.'} (not a list)"]
        return [f"{path}[{i}]" for i, d in enumerate(doc) if all(unlike(d, r) for r in real)]
    if isinstance(doc, str) and PLACEHOLDER.search(doc):
        return [] if isinstance(real, str) and like(doc).fullmatch(real) else [f"{path or '.'}: {real!r}"]
    number = (int, float)
    same_kind = type(doc) is type(real) or (isinstance(doc, number) and isinstance(real, number)
                                             and not isinstance(doc, bool) and not isinstance(real, bool))
    return [] if same_kind and doc == real else [f"{path or '.'}: {real!r}, not {doc!r}"]


def compare_output(doc, actual, values=False):
    """What is wrong with doc (a block shown as output) against actual (what ran), or None.
    JSON: every key the doc names is in the output (log lines: in the line with the same
    msg), and with values, each JSON value the doc shows is like one of the output's
    (unlike); text: every line the doc shows is a line of the output, with … and <…>
    standing for anything."""
    real = json_values(actual)
    shown = json_values(doc)
    doc_keys = set(re.findall(r'"([A-Za-z_][\w.-]*)"\s*:', doc))
    if doc_keys:
        if not real:
            return f"the output holds no JSON:\n{actual[-2000:]}"
        if values:
            if not shown:
                return "the output the page shows is not JSON: its values cannot be compared"
            for v in shown:
                diffs = [unlike(v, r) for r in real]
                if all(diffs):
                    nearest = min(diffs, key=len)
                    return (f"no value like {json.dumps(v, ensure_ascii=False)} in the output (the nearest "
                            f"differs at {', '.join(nearest)}):\n{actual[-2000:]}")
            return None
        if len(shown) == 1 and len(real) == 1 and "msg" not in shown[0]:
            # one value each: compared key by key, where each sits
            missing = missing_in(shown[0], real[0])
            return f"the output has no {missing}:\n{actual[-2000:]}" if missing else None
        by_msg = [v for v in shown if isinstance(v, dict) and "msg" in v]
        for v in by_msg:
            same = [r for r in real if isinstance(r, dict) and r.get("msg") == v["msg"]]
            if not same:
                return f'no line with "msg": "{v["msg"]}" in the output:\n{actual[-2000:]}'
            missing = set(v) - set().union(*(set(r) for r in same))
            if missing:
                return f'the "{v["msg"]}" line has no {sorted(missing)}: {same[0]}'
        missing = doc_keys - keys_of(real)
        return f"the output has no {sorted(missing)}:\n{actual[-2000:]}" if missing else None
    lines = [l.strip() for l in actual.splitlines()]
    for want in doc.splitlines():
        want = want.strip()
        if not want:
            continue
        rx = like(want)
        if not any(rx.fullmatch(l) for l in lines):
            return f"no line like {want!r} in the output:\n{actual[-2000:]}"
    return None


# ---------------------------------------------------------------------------- the sandbox

class SandboxError(Exception):
    pass


class Sandbox:
    """Namespaces of their own (see the module's comment); `enter` is the command prefix
    that runs a program inside. Everything in it dies with it (its process namespace's
    first process is killed)."""

    OVERLAID = ("/etc", "/usr", "/var", "/root", "/opt")

    def __init__(self, folder, source_root):
        self.folder = Path(folder)
        if os.geteuid() != 0:
            raise SandboxError("it takes root (mounts and namespaces): the test machines run the suite as root")
        def overlay(n, target, seen_as=lambda p: p):
            """The mount of an overlay on target whose changes go to the test's folder
            (seen_as: where the machine's paths are at that point), and its check."""
            up, work = self.folder / f"ov{n}/up", self.folder / f"ov{n}/work"
            up.mkdir(parents=True)
            work.mkdir(parents=True)
            return (f"mkdir -p {target}\n"
                    f"mount -t overlay overlay -o lowerdir={seen_as(target)},upperdir={seen_as(up)},"
                    f"workdir={seen_as(work)} {target}\n"
                    f"[ \"$(findmnt -n -o FSTYPE --target {target})\" = overlay ] || exit 3\n")
        # /tmp is emptied after the system's folders are overlaid; the machine's /tmp stays
        # reachable at HELD for the source tree's overlay (a tree, or the test's folder,
        # may be under /tmp)
        held = "/var/lib/fleetgate-docs-tmp"
        seen = lambda p: held + str(p)[4:] if str(p) == "/tmp" or str(p).startswith("/tmp/") else str(p)  # noqa: E731
        setup = ("set -eu\nip link set lo up\n" +
                 "".join(overlay(n, t) for n, t in enumerate(self.OVERLAID, 1)) +
                 f"mkdir -p {held}\nmount --bind /tmp {held}\n"
                 "mount -t tmpfs -o mode=1777 tmpfs /tmp\n" +
                 overlay(0, str(source_root), seen) +
                 "mkdir -p /tmp/home /tmp/.fgdocs\necho ready\nexec sleep infinity\n")
        # niced: a release build in an example must not starve the suite's other tests, whose
        # daemons keep time (the examples wait with generous bounds)
        cmd = ["nice", "-n", "10", "unshare", "--mount", "--net", "--pid", "--fork", "--kill-child",
               "--mount-proc", "--propagation", "private"]
        self.holder = subprocess.Popen(cmd + ["bash", "-c", setup], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       preexec_fn=_die_with_parent)
        line = _readline(self.holder.stdout, 20)
        if line != "ready\n":
            self.close()
            raise SandboxError(f"the sandbox did not start ({' '.join(cmd)}): {line!r} "
                               f"{self.holder.stderr.read()[-1000:]}")
        self.pid = _child_of(self.holder.pid)
        self.enter = ["nsenter", "-t", str(self.pid), "-m", "-n", "-p"]

    def close(self):
        # the namespace's first process: every process in the namespace ends with it
        if getattr(self, "pid", None):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.holder.poll() is None:
            self.holder.kill()  # (--kill-child: its child goes with it too)
        try:
            self.holder.wait(10)
        except subprocess.TimeoutExpired:
            pass


def _die_with_parent():
    """In the child before exec: SIGKILL when the test's process ends, however it ends
    (then --kill-child takes the namespace with it)."""
    import ctypes  # noqa: PLC0415
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _readline(stream, timeout):
    q = queue.Queue()
    threading.Thread(target=lambda: q.put(stream.readline()), daemon=True).start()
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        return ""


def _child_of(pid):
    for _ in range(100):
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise SandboxError(f"unshare ({pid}) has no child")


@dataclass
class Result:
    out: str
    err: str
    errors: int        # commands that failed (the ERR trap)
    finished: bool

    @property
    def both(self):
        return self.out + self.err


class Session:
    """One bash in the sandbox, as a reader's terminal: blocks are sourced into it one
    after the other (stdin from /dev/null), so variables, the folder and background jobs
    carry over. A command that fails is counted (an ERR trap); a variable used unset ends
    the session (set -u), as it should end the reader's paste."""

    def __init__(self, box, cwd, path_first):
        env = {"HOME": "/tmp/home", "USER": "root", "LOGNAME": "root", "LANG": "C.UTF-8",
               "TERM": "dumb", "SHELL": "/bin/bash",
               "PATH": f"{path_first}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        # (nsenter's --wd would keep the folder of the machine's tree, under the overlay:
        # the session starts in / and goes to cwd from inside)
        self.proc = subprocess.Popen(box.enter + ["env", "-i"] +
                                     [f"{k}={v}" for k, v in env.items()] +
                                     ["bash", "--noprofile", "--norc"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, cwd="/")
        self.q = {"out": queue.Queue(), "err": queue.Queue()}
        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(stream, self.q[name]), daemon=True).start()
        self.n = 0
        # and is where the overlay is, never the machine's tree (else the shell ends)
        self.send(f"cd {cwd} && [ \"$(stat -c %d .)\" != \"$(stat -c %d /)\" ] && "
                  f"[ \"$(findmnt -n -o FSTYPE -T .)\" = overlay ] || exit 9\n"
                  "set -E -u -o pipefail\n"
                  "trap '__fg_rc=$?; __fg_errs=$((__fg_errs+1)); echo \"FG-ERR (exit $__fg_rc): $BASH_COMMAND\" >&2' ERR\n")

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put(line)
        q.put(None)

    def send(self, text):
        try:
            self.proc.stdin.write(text)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def _collect(self, name, mark, deadline):
        lines = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return lines, None
            try:
                line = self.q[name].get(timeout=left)
            except queue.Empty:
                return lines, None
            if line is None:
                return lines, None
            if line.startswith(mark):
                return lines, line[len(mark):].strip()
            lines.append(line)

    def run(self, text, timeout=120):
        """Source text in the session; its output and how many of its commands failed."""
        self.n += 1
        eof = "FG_EOF_" + uuid.uuid4().hex
        mark = "FG-END-" + uuid.uuid4().hex
        path = f"/tmp/.fgdocs/block-{self.n}.sh"
        self.send(f"cat > {path} <<'{eof}'\n{text}{'' if text.endswith(chr(10)) else chr(10)}{eof}\n"
                  f"__fg_errs=0; source {path} </dev/null\n"
                  f"printf '\\n{mark} %s\\n' \"$__fg_errs\"; printf '\\n{mark}\\n' >&2\n")
        deadline = time.monotonic() + timeout
        out, n_err = self._collect("out", mark, deadline)
        err, _ = self._collect("err", mark, deadline)
        clean = lambda ls: "".join(l for l in ls if not l.startswith("FG-ERR")).strip("\n") + "\n"  # noqa: E731
        finished = n_err is not None
        errors = int(n_err) if finished and n_err.isdigit() else 1
        res = Result(clean(out), "".join(err).strip("\n") + "\n", errors, finished)
        if os.environ.get("FLEETGATE_DOCS_TIMES"):
            print(f"{timeout - (deadline - time.monotonic()):6.1f} s  {text.strip().splitlines()[0][:100]}",
                  file=sys.stderr)
        return res

    def write(self, name, text):
        eof = "FG_EOF_" + uuid.uuid4().hex
        return self.run(f"cat > {name} <<'{eof}'\n{text}{eof}\n")

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def console_steps(text):
    """A console transcript as [(command, expected output lines)]; `$ cat FILE` followed by
    its content is a file to write: ("write", FILE, content)."""
    steps, cur = [], None
    for line in text.splitlines():
        if line.startswith("$ "):
            cur = [line[2:], []]
            steps.append(cur)
        elif cur is not None:
            cur[1].append(line)
    out = []
    for cmd, lines in steps:
        m = re.fullmatch(r"cat (\S+)", cmd)
        out.append(("write", m.group(1), "\n".join(lines) + "\n") if m else ("run", cmd, lines))
    return out


def which(name):
    return shutil.which(name, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
