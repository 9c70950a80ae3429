#!/usr/bin/env python3
"""Count the writes to a gw_replica's fields made outside the module that owns them.

Reads gw_replica (gateway/replica.h): each top-level field, and each field of a part
(a member of a struct type whose comment right above says `owner: MODULE.c ...`), and lists every
write in gateway/*.c -- `X->f = `, `X->f += `, `X->f++`, `++X->f`, `X->part.f = `,
`snprintf(X->f`, `memcpy(X->f`, ... -- where X is a variable the file declares as a
`gw_replica *`, a member named `replica` or a fleet event's `ev->r`. A write counts when the file is not the
owner of the field: replica.c for the top-level fields, the part's owner for a part's.

  tests/tools/replica_writes.py [--list] [--replica-owns-all] [ROOT]

--replica-owns-all counts every write from outside replica.c, the parts' own owners too
(the direct writes left, whoever owns them).
"""
import os
import re
import sys


def parse_struct(text, name):
    m = re.search(r'typedef struct ' + name + r' \{(.*?)\n\} ' + name + ';', text, re.S)
    if not m:
        sys.exit('no struct ' + name)
    return m.group(1)


def fields_of(body):
    out = []
    body = re.sub(r'/\*.*?\*/', '', body, flags=re.S)
    depth = 0
    for stmt in body.split(';'):
        s = stmt.strip()
        if not s or '(' in s:
            continue
        s = re.sub(r'\[[^\]]*\]', '', s)
        if '{' in s or '}' in s:
            continue
        decl = re.sub(r'^(const\s+)?(unsigned\s+|signed\s+)?(struct\s+)?\w+\s*', '', s)
        for part in decl.split(','):
            n = re.sub(r'[*\s]', '', part)
            if re.fullmatch(r'\w+', n):
                out.append((n, s.split()[0] if not s.startswith('struct') else s.split()[1]))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), '..', '..')
    gw = os.path.join(root, 'gateway')
    hdr = open(os.path.join(gw, 'replica.h')).read()
    body = parse_struct(hdr, 'gw_replica')
    # parts: members whose type is a struct declared with an "owner: X.c" comment
    owners = {}  # struct type -> its owner modules (the comment right above it says)
    for m in re.finditer(r'(/\*(?:(?!\*/).)*\*/)\s*typedef struct (\w+) \{', hdr, re.S):
        o = re.search(r'owner: ((?:\w+\.c\s*)+)', m.group(1))
        if o:
            owners[m.group(2)] = o.group(1).split()
    top = {}   # field -> owner
    parts = {}  # part member -> (owner, set of fields)
    for name, typ in fields_of(body):
        if typ in owners:
            pf = {n for n, _ in fields_of(parse_struct(hdr, typ))}
            parts[name] = (['replica.c'] if '--replica-owns-all' in sys.argv else owners[typ], pf)
        else:
            top[name] = ['replica.c']
    assign = r'\s*(?:\[[^\]]*\])?(?:\.\w+)*\s*(?:[-+*/|&^]?=(?!=)|\+\+|--)'
    total = 0
    bymod = {}
    rows = []
    for fn in sorted(os.listdir(gw)):
        if not fn.endswith('.c'):
            continue
        src = open(os.path.join(gw, fn)).read()
        names = set(re.findall(r'gw_replica\s*\*\s*(?:const\s+)?(\w+)', src)) | {'replica'}
        names |= set(re.findall(r'gw_replica\s*\*\s*const\s*\*\s*(\w+)', src))
        recv = r'(?:\bev->r|\b(?:' + '|'.join(sorted(names)) + r'))(?:\[[^\]]*\])?->'
        for ln, line in enumerate(src.split('\n'), 1):
            if line.lstrip().startswith(('*', '/*', '//')):
                continue
            hits = []
            for f, own in top.items():
                for pat in (recv + f + r'\b' + assign, r'(?:\+\+|--)\s*' + recv + f + r'\b',
                            r'\b(?:snprintf|memcpy|memset|strcpy|strncpy|pr_strlcpy)\s*\(\s*&?' + recv + f + r'\b'):
                    if re.search(pat, line):
                        hits.append((f, own))
                        break
            for p, (own, pf) in parts.items():
                for f in pf:
                    acc = recv + p + r'\.' + f + r'\b'
                    for pat in (acc + assign, r'(?:\+\+|--)\s*' + acc,
                                r'\b(?:snprintf|memcpy|memset|strcpy|strncpy|pr_strlcpy)\s*\(\s*&?' + acc):
                        if re.search(pat, line):
                            hits.append((p + '.' + f, own))
                            break
            for f, own in hits:
                if fn in own:
                    continue
                total += 1
                bymod[fn] = bymod.get(fn, 0) + 1
                rows.append('%s:%d: %s (owner %s)' % (fn, ln, f, ' '.join(own)))
    if '--list' in sys.argv:
        print('\n'.join(rows))
    print('fields: %d top-level, %d parts (%s)' % (len(top), len(parts),
          ', '.join('%s: %s' % (p, ' '.join(o)) for p, (o, _) in sorted(parts.items()))))
    print('writes from outside the owner: %d, from %d modules: %s' % (
        total, len(bymod), ', '.join('%s %d' % kv for kv in sorted(bymod.items(), key=lambda kv: -kv[1]))))


if __name__ == '__main__':
    main()
