#!/usr/bin/env python3
"""The API reference, made from the public headers' comments.

    python3 docs/gen_reference.py           writes docs/reference/*.md
    python3 docs/gen_reference.py --check   fails if they differ from what
                                            the headers make, or if a public
                                            call has no comment (CTest
                                            test_reference runs this)

One page per header of <atap.h> (atap/core.h, fs.h, net.h, process.h,
tasks.h) and an index, docs/reference/README.md, listing every call. A
page follows its header: the header's opening comment, then each section
(the /* ---- */ banners) with every item in it, in the header's order. An
item is a comment and the declarations right under it (no blank line
between): its code goes in a C block, its comment as text. A comment
followed by a blank line is prose of the section.

A call is documented when a comment stands right above it, or above the
declarations it is one of (atap_sleep and atap_sleep_relaxed share one),
and that comment says whether the call blocks and from which threads
("Blocks:" and "Threads:"), as atap.h's conventions ask. A call without
them fails the run, which names it.

Python 3 alone; no Markdown tool is needed to make or check the pages.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "reference")
HEADERS = [
    ("core", "include/atap/core.h", "The runtime"),
    ("fs", "include/atap/fs.h", "Files and watches"),
    ("process", "include/atap/process.h", "Child processes and signals"),
    ("tasks", "include/atap/tasks.h", "A sleep, and channels"),
    ("net", "include/atap/net.h", "Sockets"),
]
GENERATED = ("<!-- Made by docs/gen_reference.py from {src}; do not edit: edit the "
             "header and run python3 docs/gen_reference.py. -->")
BANNER = re.compile(r"^/\* -{10,} \*/$")
FUNC = re.compile(r"(?:ATAP_EXPORT|static inline)\s[^;{]*?\b(atap_\w+)\s*\(", re.S)
# Lines that only help compilers and are left out of the code shown.
NOISE = re.compile(r"^(ATAP_SAME_NAME_(BEGIN|END)_)\s*$")


def comment_text(lines):
    """A block comment's lines without the comment marks."""
    text = []
    for i, line in enumerate(lines):
        s = line.strip()
        if i == 0:
            s = s[2:].lstrip()
        if s.endswith("*/"):
            s = s[:-2]
        s = s.rstrip()
        if i > 0:
            s = re.sub(r"^\* ?", "", s) if s.startswith("*") else s
        text.append(s.rstrip())
    while text and not text[0].strip():
        text.pop(0)
    while text and not text[-1].strip():
        text.pop()
    return text


def read_statement(lines, i):
    """The lines of the declaration or definition starting at lines[i]."""
    first = lines[i].strip()
    if re.match(r"#ifndef ATAP_\w+_H$", first):
        return i + 1  # the include guard: its #endif closes the file
    if first.startswith("#if"):
        depth, j = 0, i
        while j < len(lines):
            s = lines[j].strip()
            if s.startswith("#if"):
                depth += 1
            elif s.startswith("#endif"):
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return j
    if first.startswith("#"):
        j = i
        while lines[j].rstrip().endswith("\\"):
            j += 1
        return j + 1
    depth, j, text = 0, i, ""
    while j < len(lines):
        s = re.sub(r"/\*.*?\*/", "", lines[j])
        text += s + "\n"
        depth += s.count("{") - s.count("}")
        j += 1
        if depth == 0:
            code = text.strip()
            if code.endswith(";"):
                return j
            # a function's definition ends at its closing brace
            if code.endswith("}") and "(" in code.split("{", 1)[0] and not re.match(
                    r"(typedef\s+)?(struct|enum|union)\b", code):
                return j
        if not lines[j - 1].strip() and depth == 0:
            return j - 1
    return j


def parse(path):
    """(intro, [(section, [items])]): an item is (comment lines, code lines)."""
    with open(os.path.join(ROOT, path)) as f:
        lines = [l.rstrip("\n") for l in f]
    lines = [l for l in lines if not NOISE.match(l.strip())]
    sections, items, intro, title = [], [], None, None
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if (BANNER.match(s) and i + 2 < len(lines) and BANNER.match(lines[i + 2].strip())):
            if items or title is not None:
                sections.append((title, items))
            title = lines[i + 1].strip()[2:-2].strip()
            items = []
            i += 3
            continue
        if s.startswith("/*") and lines[i].startswith("/*"):
            j = i
            while "*/" not in lines[j]:
                j += 1
            comment = comment_text(lines[i:j + 1])
            j += 1
            code = []
            while j < len(lines) and lines[j].strip() and not lines[j].startswith("/*"):
                k = read_statement(lines, j)
                code.extend(lines[j:k])
                j = k
            if intro is None:
                intro = comment
            elif code and not re.match(r"#(ifndef|define) ATAP_\w+_H$", code[0]):
                items.append((comment, code))
            elif not code:
                items.append((comment, []))
            i = j
            continue
        i += 1
    sections.append((title, items))
    return intro, sections


# Top-level lines that need no comment: the include guard, includes, the
# extern "C" wrapper, and the export macro's definition.
PLUMBING = re.compile(r'^(#define ATAP_\w+_H|#include|extern "C" \{|\}$|#endif)')


def undocumented(path):
    """Declarations (calls, types, macros) with no comment right above them,
    or above the declarations they follow with no blank line between."""
    with open(os.path.join(ROOT, path)) as f:
        lines = [l.rstrip("\n") for l in f]
    lines = [l for l in lines if not NOISE.match(l.strip())]
    missing, documented, i = [], False, 0
    while i < len(lines):
        line, s = lines[i], lines[i].strip()
        if not s:
            documented = False
        elif line.startswith("/*"):
            while "*/" not in lines[i]:
                i += 1
            documented = True
        elif line.startswith("#if"):
            j = read_statement(lines, i)
            found, _ = names(lines[i:j])
            if found and not documented:  # not the export macro, not extern "C"
                missing.append(", ".join(found))
            documented = False
            i = j
            continue
        elif PLUMBING.match(line):
            documented = False
        elif not line[0].isspace():
            j = read_statement(lines, i)
            if not documented:
                found, _ = names(lines[i:j])
                missing.append(", ".join(found) or line.strip())
            i = j
            continue
        i += 1
    return missing


def names(code):
    text = "\n".join(code)
    found = FUNC.findall(text)
    if found:
        return found, "call"
    m = re.search(r"}\s*(atap_\w+)\s*;", text) or re.search(
        r"^(?:typedef\s+)?(?:struct|enum)\s+(atap_\w+)\s*\{", text, re.M)
    if m:
        return [m.group(1)], "type"
    m = re.search(r"typedef\s+[^;]*?\b(atap_\w+)\s*\(", text)
    if m:
        return [m.group(1)], "type"
    m = re.search(r"typedef\s+struct\s+(atap_\w+)\s+(atap_\w+)\s*;", text)
    if m:
        return [m.group(2)], "type"
    macros = re.findall(r"^#\s*define\s+(ATAP_\w+)", text, re.M)
    seen = []
    for n in macros:
        if n not in seen and not n.endswith("_"):
            seen.append(n)
    return seen, "macro"


MD_SPECIAL = re.compile(r"([\\*_\[\]<>#|])")  # `code` stays code


def prose(text):
    """A comment as Markdown: plain paragraphs escaped and left to flow; a
    paragraph with indented lines (a list, a table, an example) kept as it
    is written, in a text block."""
    out, para = [], []

    def flush():
        if not para:
            return
        if any(l.startswith("  ") for l in para):
            width = min(len(l) - len(l.lstrip()) for l in para if l.strip())
            code = all(l.startswith("    ") for l in para)
            out.append("```c" if code else "```text")
            out.extend(l[width:] if code else l for l in para)
            out.append("```")
        else:
            out.extend(MD_SPECIAL.sub(r"\\\1", l) for l in para)
        out.append("")
        para.clear()

    for line in text:
        if line.strip():
            para.append(line)
        else:
            flush()
    flush()
    return out


def anchor(name):
    return name


def page(key, path, title, index):
    intro, sections = parse(path)
    out = [GENERATED.format(src=path), "", "# `<atap/%s.h>`: %s" % (key, title), ""]
    out += ["[All headers](README.md)", ""]
    out += prose(intro or [])
    for sec, items in sections:
        if sec:
            out += ["## " + sec, ""]
        for comment, code in items:
            if not code:
                out += prose(comment)
                continue
            found, kind = names(code)
            if found:
                out += ['<a id="%s"></a>' % anchor(n) for n in found]
                out += ["### " + ", ".join(found), ""]
                for n in found:
                    index.append((n, kind, key, sec or ""))
            shown = [l.replace("ATAP_EXPORT ", "") for l in code]
            out += ["```c"] + shown + ["```", ""]
            out += prose(comment)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def index_page(index):
    out = [GENERATED.format(src="include/atap.h and its headers"), "",
           "# libatap API reference", "",
           "Made from the comments of the public headers by `docs/gen_reference.py`, "
           "and checked against them by the test suite (CTest `test_reference`), so it "
           "says what the headers say. `#include <atap.h>` brings in every header "
           "below; the conventions every call follows (return codes, handles, "
           "versioned structs, \"Blocks\" and \"Threads\") are at the top of "
           "[`atap/core.h`](core.md). The C++ layer, `atap.hpp`, is documented in the "
           "header itself and in the README.", ""]
    out += ["| header | what |", "|---|---|"]
    for key, path, title in HEADERS:
        out.append("| [`<atap/%s.h>`](%s.md) | %s |" % (key, key, title))
    out.append("")
    for kind, heading in (("call", "Calls"), ("type", "Types"), ("macro", "Constants and macros")):
        out += ["## " + heading, ""]
        rows = sorted((n, key, sec) for n, k, key, sec in index if k == kind)
        out += ["| name | header | section |", "|---|---|---|"]
        for n, key, sec in rows:
            out.append("| [`%s`](%s.md#%s) | `atap/%s.h` | %s |" % (n, key, anchor(n), key, sec))
        out.append("")
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def lacks_blocks_threads(path):
    """Calls whose comment does not say "Blocks:" and "Threads:"."""
    bad = []
    _, sections = parse(path)
    for _, items in sections:
        for comment, code in items:
            found, kind = names(code) if code else ([], None)
            if kind != "call":
                continue
            text = " ".join(comment)
            if "Blocks:" not in text or "Threads:" not in text:
                bad.extend(found)
    return bad


def main():
    check = "--check" in sys.argv[1:]
    pages, index, problems = {}, [], []
    for key, path, title in HEADERS:
        for n in undocumented(path):
            problems.append("%s: %s: no comment above it" % (path, n))
        for n in lacks_blocks_threads(path):
            problems.append("%s: %s's comment does not say \"Blocks:\" and \"Threads:\"" %
                            (path, n))
        pages[key + ".md"] = page(key, path, title, index)
    pages["README.md"] = index_page(index)
    for name, text in sorted(pages.items()):
        target = os.path.join(OUT, name)
        if check:
            try:
                with open(target) as f:
                    same = f.read() == text
            except OSError:
                same = False
            if not same:
                problems.append("docs/reference/%s is not what the headers make: run "
                                "python3 docs/gen_reference.py" % name)
        else:
            os.makedirs(OUT, exist_ok=True)
            with open(target, "w") as f:
                f.write(text)
    if check:
        known = set(pages)
        for name in sorted(os.listdir(OUT)) if os.path.isdir(OUT) else []:
            if name.endswith(".md") and name not in known:
                problems.append("docs/reference/%s is made from no header" % name)
    for p in problems:
        print("reference: " + p)
    calls = sum(1 for _, k, _, _ in index if k == "call")
    print("reference: %d calls in %d headers, %s" %
          (calls, len(HEADERS), "%d problem(s)" % len(problems) if problems else
           ("up to date" if check else "written to docs/reference/")))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
