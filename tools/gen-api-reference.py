#!/usr/bin/env python3
"""Writes docs/reference.md, the function reference of libllmt, from the
public headers (include/llmt/*.h): each header's opening comment, then its
declarations in order, each with the comment written right above it.
Standard library only.

    tools/gen-api-reference.py            rewrite docs/reference.md
    tools/gen-api-reference.py --check    exit 1 if it is out of date

What is read, per header, at the top level (inside the include guard and the
extern "C" block):
- a comment block starting a line, /* ... */: the text of the next item; one
  followed by a blank line, or by anything that is not an item, is shown as
  prose where it stands;
- an LLMT_API declaration, up to its ';': a function (it must have a comment:
  the house rule, checked here too);
- any other statement up to its ';' at brace depth 0 (typedef, struct, enum):
  shown verbatim, with its comment;
- #define lines (with their continuations) outside conditional blocks: shown
  verbatim, consecutive ones together.
Everything else (include guards, #include, conditional blocks) is skipped.
A construct it cannot read (a comment or statement that never ends) is an
error naming the file and line, so the reference cannot silently drop one.
"""
import argparse
import difflib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "include", "llmt")
OUTPUT = os.path.join(ROOT, "docs", "reference.md")
SELF = "tools/gen-api-reference.py"


class HeaderError(Exception):
    pass


def comment_text(lines):
    """The text of a /* ... */ block given as its source lines."""
    text = "\n".join(lines).strip()
    text = text[2:-2] if text.startswith("/*") and text.endswith("*/") else text
    out = []
    for line in text.split("\n"):
        line = line.rstrip()
        stripped = line.lstrip()
        if stripped.startswith("* ") or stripped == "*":
            line = stripped[2:]
        out.append(line.rstrip())
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    # The first line follows "/*" on the same line: drop its leading space.
    if out:
        out[0] = out[0].strip()
    return "\n".join(out)


def read_comment(lines, i, path):
    """(source lines of the comment starting at lines[i], next index)."""
    start = i
    while "*/" not in lines[i]:
        i += 1
        if i == len(lines):
            raise HeaderError(f"{path}:{start + 1}: a comment that never ends")
    if lines[i].split("*/", 1)[1].strip():
        raise HeaderError(f"{path}:{i + 1}: code after a comment on the same line")
    return lines[start:i + 1], i + 1


def read_statement(lines, i, path):
    """(source lines of the statement starting at lines[i], up to the ';' at
    brace depth 0, next index)."""
    start, depth = i, 0
    while True:
        code = re.sub(r"/\*.*?\*/", "", lines[i])  # inline comments hold no braces that count
        for ch in code:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
        if depth == 0 and code.rstrip().endswith(";"):
            return lines[start:i + 1], i + 1
        i += 1
        if i == len(lines):
            raise HeaderError(f"{path}:{start + 1}: a declaration that never ends with ';'")


def function_name(decl, path, line):
    m = re.search(r"\b(llmt_[a-z0-9_]+)\s*\(", " ".join(decl))
    if not m:
        raise HeaderError(f"{path}:{line}: cannot find the function name of: {decl[0].strip()}")
    return m.group(1)


def parse_header(path):
    """(opening comment text, items): items are ("prose", text),
    ("function", name, comment, code), ("code", comment, code)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    rel = os.path.relpath(path, ROOT)
    intro, items, pending = "", [], None
    i, cond_depth, macros = 0, 0, None

    def flush_pending():
        nonlocal pending
        if pending is not None and pending.strip():
            items.append(("prose", pending))
        pending = None

    def end_macros():
        nonlocal macros
        if macros is not None:
            items.append(("code", macros[0], "\n".join(macros[1])))
            macros = None

    if lines and lines[0].startswith("/*"):
        block, i = read_comment(lines, 0, rel)
        intro = comment_text(block)
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("#"):
            directive = stripped[1:].strip()
            if directive.startswith("if"):
                cond_depth += 1
            elif directive.startswith("endif"):
                cond_depth -= 1
            elif directive.startswith("define") and cond_depth == 1:
                block = [line]
                while block[-1].rstrip().endswith("\\"):
                    i += 1
                    if i == len(lines):
                        raise HeaderError(f"{rel}:{i}: a macro continued past the end")
                    block.append(lines[i])
                guard = re.match(r"#\s*define\s+LLMT_\w+_H\s*$", line)
                if not guard:
                    if macros is None:
                        macros = (pending, [])
                        pending = None
                    macros[1].extend(block)
                i += 1
                continue
            end_macros()
            flush_pending()
            i += 1
            continue
        end_macros()
        if not stripped:
            flush_pending()
            i += 1
        elif stripped.startswith("/*") and line.startswith("/*"):
            flush_pending()
            block, i = read_comment(lines, i, rel)
            pending = comment_text(block)
        elif cond_depth > 1 or stripped in ('extern "C" {', "}"):
            flush_pending()
            i += 1
        elif line.startswith("LLMT_API "):
            start = i
            decl, i = read_statement(lines, i, rel)
            name = function_name(decl, rel, start + 1)
            if pending is None:
                raise HeaderError(f"{rel}:{start + 1}: {name} has no comment right above it")
            items.append(("function", name, pending, "\n".join(decl)))
            pending = None
        else:
            decl, i = read_statement(lines, i, rel)
            items.append(("code", pending, "\n".join(decl)))
            pending = None
    end_macros()
    flush_pending()
    # Code right after code, with no comment of its own, shares its block.
    merged = []
    for item in items:
        if item[0] == "code" and item[1] is None and merged and merged[-1][0] == "code":
            merged[-1] = ("code", merged[-1][1], merged[-1][2] + "\n\n" + item[2])
        else:
            merged.append(item)
    return intro, merged


def header_order():
    """Header file names: the umbrella header's include order, then any
    other header alphabetically (a new header shows up even before it is
    added to llmt.h). comm_mpi.h is left out: its functions are static
    inline code compiled in the host program (docs/distributed.md)."""
    names = sorted(n for n in os.listdir(INCLUDE) if n.endswith(".h") and n != "comm_mpi.h")
    with open(os.path.join(INCLUDE, "llmt.h"), encoding="utf-8") as f:
        included = re.findall(r'^#include "llmt/([a-z0-9_]+\.h)"', f.read(), re.M)
    ordered = [n for n in included if n in names]
    return ordered + [n for n in names if n not in ordered and n != "llmt.h"]


def render():
    umbrella_intro, _ = parse_header(os.path.join(INCLUDE, "llmt.h"))
    headers = [(name, *parse_header(os.path.join(INCLUDE, name))) for name in header_order()]
    out = ["# API reference", "",
           f"Generated by `{SELF}` from the comments of `include/llmt/*.h`; do not",
           "edit it by hand: change the header and run the script (the ctest",
           "`api_reference` fails while this file differs from what it writes).",
           "`docs/API.md` has the conventions these functions follow.", "",
           "## Contents", ""]
    for name, _, items in headers:
        functions = [f"[{it[1]}](#{it[1]})" for it in items if it[0] == "function"]
        line = f"- [`llmt/{name}`](#llmt{name[:-2]}h)"
        out.append(line + (": " + ", ".join(functions) if functions else ""))
    out += ["", "## `llmt/llmt.h`", "", umbrella_intro, ""]
    for name, intro, items in headers:
        out += [f"## `llmt/{name}`", ""]
        if intro:
            out += [intro, ""]
        for item in items:
            if item[0] == "prose":
                out += [item[1], ""]
            elif item[0] == "function":
                _, fname, comment, code = item
                out += [f"### {fname}", "", "```c", code, "```", "", comment, ""]
            else:
                _, comment, code = item
                if comment:
                    out += [comment, ""]
                out += ["```c", code, "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with docs/reference.md instead of writing it")
    parser.add_argument("--output", default=OUTPUT, help="the file (default docs/reference.md)")
    args = parser.parse_args()
    try:
        text = render()
    except HeaderError as e:
        print(f"gen-api-reference: {e}", file=sys.stderr)
        return 1
    if not args.check:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        return 0
    try:
        with open(args.output, encoding="utf-8") as f:
            current = f.read()
    except OSError as e:
        print(f"gen-api-reference: {args.output}: {e.strerror}", file=sys.stderr)
        return 1
    if current == text:
        print(f"ok: {os.path.relpath(args.output, ROOT)} is up to date with the headers")
        return 0
    diff = difflib.unified_diff(current.split("\n"), text.split("\n"), "committed", "headers",
                                lineterm="", n=1)
    print("\n".join(list(diff)[:60]), file=sys.stderr)
    print(f"gen-api-reference: {os.path.relpath(args.output, ROOT)} is out of date with "
          f"include/llmt/*.h: run {SELF}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
