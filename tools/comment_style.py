#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""comment_style.py: one way to open a C comment (docs/conventions.md, "Source layout").

A comment at column 0 (one that opens a file or precedes a declaration)
starts "/*  " (two spaces) and its continuation lines are indented four, so
its text stands in one column. Any other comment (indented, trailing, or
one line inside code) starts "/* " (one space). Left as they are: the
license line "/* SPDX-License-Identifier: MIT */" and the empty "/**/".

    tools/comment_style.py [SOURCE_DIR]           rewrite the comments that break the rule
    tools/comment_style.py --check [SOURCE_DIR]   list them as FILE:LINE, exit 1 if any
    tools/comment_style.py --stats [SOURCE_DIR]   count the forms

It reads the C sources and headers the project owns (DIRS below, build
directories left out). A rewrite changes the opener and, when the width of
the opener changes, moves the continuation lines by as much so the block
stays aligned; nothing else. Running it again changes nothing, so it can be
run after a merge.
"""
import collections
import os
import sys

DIRS = ("autograd core data nn optim rpc dist_autograd dist_optim dist_nn ps include "
        "examples tools tests bench").split()
COL0_SPACES = 2     # "/*  " at column 0
OTHER_SPACES = 1    # "/* " anywhere else


def source_files(root):
    for d in DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(n for n in dirnames if not n.startswith("build"))
            for name in sorted(filenames):
                if name.endswith((".c", ".h")):
                    yield os.path.join(dirpath, name)


def block_comments(text):
    """(start, end) of every /* */ comment, skipping strings, characters and // comments."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i += 1
            while i < n and text[i] != c and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            yield i, j
            i = j
        else:
            i += 1


def kind(text, start, end):
    """'skip', 'col0', 'indented' or 'trailing'."""
    body = text[start:end]
    line_start = text.rfind("\n", 0, start) + 1
    before = text[line_start:start]
    if body == "/**/" or ("\n" not in body and body.startswith("/* SPDX-License-Identifier:")
                          and before == ""):
        return "skip"
    if before == "":
        return "col0"
    return "indented" if before.strip() == "" else "trailing"


def spaces_after_opener(body):
    k = 2
    while k < len(body) and body[k] == " ":
        k += 1
    return k - 2


def analyse(text):
    """One tuple per comment: (start, end, kind, spaces, want, lines_ok)."""
    out = []
    for start, end in block_comments(text):
        k = kind(text, start, end)
        if k == "skip":
            continue
        body = text[start:end]
        want = COL0_SPACES if k == "col0" else OTHER_SPACES
        spaces = spaces_after_opener(body)
        # Text follows the spaces on the opener's line ("/*" alone on its line is not a form here).
        good_opener = spaces == want and body[2 + spaces:].strip() not in ("", "*/") \
            and body[2 + spaces] != "\n"
        lines_ok = True
        if k == "col0":
            for line in body.split("\n")[1:]:
                s = line.strip()
                if s and not s.startswith("*/") and len(line) - len(line.lstrip(" ")) < 4:
                    lines_ok = False
        out.append((start, end, k, spaces, want, good_opener, lines_ok))
    return out


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def rewrite(text):
    """The text with every fixable comment rewritten; (new_text, fixed, unfixable lines)."""
    pieces, last, fixed, unfixable = [], 0, 0, []
    for start, end, k, spaces, want, good_opener, lines_ok in analyse(text):
        if good_opener:
            if not lines_ok:
                unfixable.append(line_of(text, start))
            continue
        body = text[start:end]
        # "/*" alone on its line, "/**", an empty "/* */", a tab: by hand.
        if (body[2 + spaces] == "\n" or body[2:].strip() in ("", "*/") or "\t" in body
                or (spaces == 0 and body[2] == "*")):
            unfixable.append(line_of(text, start))
            continue
        col = start - (text.rfind("\n", 0, start) + 1)
        old_col, new_col = col + 2 + spaces, col + 2 + want
        lines = body.split("\n")
        lines[0] = "/*" + " " * want + lines[0][2 + spaces:]
        rest = [l for l in lines[1:] if l.strip() and not l.strip().startswith("*/")]
        # Continuation lines aligned with the old text move with it; a block laid
        # out some other way (text already at the new column) is left alone.
        if rest and min(len(l) - len(l.lstrip(" ")) for l in rest) == old_col:
            delta = new_col - old_col
            for i in range(1, len(lines)):
                l = lines[i]
                ind = len(l) - len(l.lstrip(" "))
                if l.strip() and ind >= old_col:
                    lines[i] = " " * (ind + delta) + l.lstrip(" ")
        new = "\n".join(lines)
        if k == "col0" and not analyse(new)[0][6]:
            unfixable.append(line_of(text, start))
        pieces.append(text[last:start])
        pieces.append(new)
        last = end
        fixed += 1
    pieces.append(text[last:])
    return "".join(pieces), fixed, unfixable


def main(argv):
    mode = "fix"
    args = [a for a in argv if not a.startswith("--")]
    for a in argv:
        if a in ("--check", "--stats"):
            mode = a[2:]
        elif a.startswith("--"):
            sys.stderr.write(__doc__)
            return 2
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    bad, nfiles, nfixed, stats = 0, 0, 0, collections.Counter()
    for path in source_files(root):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(path, root)
        nfiles += 1
        if mode == "stats":
            for start, end, k, spaces, want, good, lines_ok in analyse(text):
                form = {1: "'/* '", 2: "'/*  '"}.get(spaces, "other")
                shape = "multi-line" if "\n" in text[start:end] else "one-line"
                stats[(k, shape, form)] += 1
            continue
        if mode == "check":
            for start, end, k, spaces, want, good, lines_ok in analyse(text):
                line = line_of(text, start)
                if not good:
                    what = {"col0": "a comment at column 0", "indented": "an indented comment",
                            "trailing": "a trailing comment"}[k]
                    print(f"{rel}:{line}: {what} opens '/*{' ' * want}' "
                          f"({'two spaces' if want == 2 else 'one space'}) and then its text")
                    bad += 1
                elif not lines_ok:
                    print(f"{rel}:{line}: a column-0 comment's continuation lines are "
                          f"indented at least four")
                    bad += 1
            continue
        new, fixed, unfixable = rewrite(text)
        for line in unfixable:
            print(f"{rel}:{line}: not rewritten, fix by hand", file=sys.stderr)
            bad += 1
        if fixed:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            nfixed += fixed
    if mode == "stats":
        for key in sorted(stats):
            print(f"{stats[key]:6d}  {key[0]:9s} {key[1]:10s} {key[2]}")
        print(f"{sum(stats.values()):6d}  comments in {nfiles} files "
              f"(license lines and /**/ not counted)")
        return 0
    if mode == "check":
        if bad:
            print(f"comment_style: {bad} comments break the rule (docs/conventions.md, "
                  f"\"Source layout\"; fix: tools/comment_style.py)", file=sys.stderr)
            return 1
        print(f"comment_style: the comments of {nfiles} files follow the rule")
        return 0
    print(f"comment_style: {nfixed} comments rewritten")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
