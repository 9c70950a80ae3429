"""Writes deploy/systemd/fleetgate.service with the build's own paths (meson install):
the source file is a complete unit for --prefix=/usr/local --sysconfdir=/etc."""
import sys

src, dst, bindir, etcdir, docdir = sys.argv[1:6]
text = open(src, encoding="utf-8").read()
for old, new in (("/usr/local/bin/", bindir.rstrip("/") + "/"),
                 ("/etc/fleetgate", etcdir.rstrip("/")),
                 ("/usr/local/share/doc/fleetgate", docdir.rstrip("/"))):
    text = text.replace(old, new)
open(dst, "w", encoding="utf-8").write(text)
