#!/usr/bin/env python3
"""check_docs.py: the docs against the code.

  check_docs.py options SRC_DIR CORALLOC_CMD
      docs/OPTIONS.md's table lists exactly the library's options
      (`coralloc options`, from coral_option_info), each with the same
      default, accepted values and when it may change.
  check_docs.py examples SRC_DIR CORALLOC_CMD BUILD_DIR CMAKE
      every ```c and ```cpp block of README.md and docs/*.md is compiled
      against a temporary install of the build (pkg-config coralloc) and run
      (it must exit 0); a ```cmake block is built as CMakeLists.txt with the
      C/C++ blocks before it in the same file as main.c / main.cpp. (```rust
      blocks are doctests of bindings/rust: cargo test runs them.)
  check_docs.py synopsis SRC_DIR CORALLOC_CMD
      the SYNOPSIS of docs/man/coralloc.1, as groff renders it, is the
      usage of `coralloc --help` (its first paragraph), line for line.
Exit 0: consistent; 1: not; 77: a tool is missing (skipped).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def library_options(cmd):
    out = subprocess.run([cmd, "options"], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("CORALLOC_")}).stdout
    opts = {}
    for line in out.splitlines()[1:]:
        name, default, accepted, _value, what = line.split(None, 4)
        opts[name] = (default, accepted, "start-up" if what.endswith("[start-up only]")
                      else "run time")
    return opts


def doc_accepted(text):
    """The doc's "accepted" cell in `coralloc options`'s notation."""
    words = re.findall(r"`([a-z]+)`", text)
    if words:
        return "|".join(words)
    text = text.replace("2^63-1", str(2**63 - 1))
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    return f"{m.group(1)}-{m.group(2)}" if m else text.strip()


def check_options(src, cmd):
    lib = library_options(cmd)
    doc = {}
    with open(os.path.join(src, "docs", "OPTIONS.md")) as f:
        for line in f:
            m = re.match(r"\|\s*`(CORALLOC_[A-Z_]+)`\s*\|([^|]*)\|([^|]*)\|([^|]*)\|", line)
            if m:
                doc[m.group(1)] = (m.group(2).strip(), doc_accepted(m.group(3)), m.group(4).strip())
    problems = []
    for name in sorted(set(lib) | set(doc)):
        if name not in doc:
            problems.append(f"{name} is an option but docs/OPTIONS.md does not list it")
        elif name not in lib:
            problems.append(f"docs/OPTIONS.md lists {name}, which is not an option")
        elif doc[name] != lib[name]:
            problems.append(f"{name}: docs/OPTIONS.md says (default, accepted, when) = "
                            f"{doc[name]}, the library {lib[name]}")
    if problems:
        fail("\n  ".join(["docs/OPTIONS.md disagrees with the option table:"] + problems))
    print(f"docs/OPTIONS.md: {len(lib)} options, all as in the library")


FENCE = re.compile(r"^```([A-Za-z+]*)\s*\n(.*?)^```\s*$", re.M | re.S)


def doc_files(src):
    files = [os.path.join(src, "README.md")]
    docs = os.path.join(src, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def run(args, what, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        fail(f"{what}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout


def check_examples(src, build, cmake):
    for tool in ("cc", "c++", "pkg-config"):
        if shutil.which(tool) is None:
            # the SKIPPED line, naming the Debian package (tests/deps.sh)
            deps = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deps.sh")
            sys.exit(subprocess.run(["bash", deps, "skipped", tool]).returncode or SKIP)
    tmp = tempfile.mkdtemp(prefix="coral_docs.")
    manifest = os.path.join(build, "install_manifest.txt")
    saved = open(manifest).read() if os.path.exists(manifest) else None
    try:
        prefix = os.path.join(tmp, "p")
        run([cmake, "--install", build, "--prefix", prefix], "cmake --install")
        pc = [os.path.join(d, f) for d, _, fs in os.walk(prefix) for f in fs if f == "coralloc.pc"]
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pc[0]))
        env = {k: v for k, v in env.items() if not k.startswith("CORALLOC_") and k != "LD_PRELOAD"}
        flags = run(["pkg-config", "--cflags", "--libs", "coralloc"], "pkg-config", env=env).split()
        libdir = run(["pkg-config", "--variable=libdir", "coralloc"], "pkg-config", env=env).strip()
        flags += ["-Wl,-rpath," + libdir, "-Wall", "-Wextra", "-Werror"]
        count = blocks = 0
        for path in doc_files(src):
            text = open(path).read()
            sources = {}
            for i, m in enumerate(FENCE.finditer(text)):
                lang, code = m.group(1).lower(), m.group(2)
                where = f"{os.path.relpath(path, src)} example {i + 1} ({lang})"
                blocks += 1
                work = os.path.join(tmp, f"ex{blocks}")
                os.makedirs(work)
                if lang in ("c", "cpp", "c++"):
                    name = "main.c" if lang == "c" else "main.cpp"
                    sources[name] = code
                    with open(os.path.join(work, name), "w") as f:
                        f.write(code)
                    compiler = "cc" if lang == "c" else "c++"
                    run([compiler, name, "-o", "example"] + flags, f"{where}: compiling", cwd=work)
                    run(["./example"], f"{where}: running", cwd=work, env=env)
                elif lang == "cmake":
                    for name, code_before in sources.items():
                        with open(os.path.join(work, name), "w") as f:
                            f.write(code_before)
                    with open(os.path.join(work, "CMakeLists.txt"), "w") as f:
                        f.write(code)
                    run([cmake, "-S", work, "-B", os.path.join(work, "b"),
                         "-DCMAKE_PREFIX_PATH=" + prefix], f"{where}: configuring", env=env)
                    run([cmake, "--build", os.path.join(work, "b")], f"{where}: building", env=env)
                    exes = [os.path.join(work, "b", f) for f in os.listdir(os.path.join(work, "b"))
                            if os.access(os.path.join(work, "b", f), os.X_OK)
                            and os.path.isfile(os.path.join(work, "b", f))]
                    if not exes:
                        fail(f"{where}: built no program")
                    for exe in exes:
                        run([exe], f"{where}: running {os.path.basename(exe)}", env=env)
                else:
                    continue
                count += 1
                print(f"ok: {where}")
        print(f"{count} examples compiled and run")
    finally:
        if saved is None:
            if os.path.exists(manifest):
                os.remove(manifest)
        else:
            with open(manifest, "w") as f:
                f.write(saved)
        shutil.rmtree(tmp, ignore_errors=True)


def check_synopsis(src, cmd):
    if shutil.which("groff") is None:
        print("SKIP: groff is not installed")
        sys.exit(SKIP)
    man = os.path.join(src, "docs", "man", "coralloc.1")
    page = subprocess.run(["groff", "-man", "-Tascii", "-P-cbou", "-rLL=300n", man],
                          capture_output=True, text=True, check=True).stdout
    m = re.search(r"^SYNOPSIS\n(.*?)\n(?=\S)", page, re.M | re.S)
    if m is None:
        fail(f"{man}: no SYNOPSIS section in groff's rendering")
    synopsis = [" ".join(line.split()) for line in m.group(1).splitlines() if line.strip()]
    help_text = subprocess.run([cmd, "--help"], capture_output=True, text=True, check=True).stdout
    usage = [" ".join(line.split()) for line in help_text.split("\n\n")[0].splitlines()]
    usage[0] = usage[0].removeprefix("usage: ")
    if synopsis != usage:
        fail("coralloc(1)'s SYNOPSIS is not `coralloc --help`'s usage:\n  man:  " +
             "\n        ".join(synopsis) + "\n  help: " + "\n        ".join(usage))
    print(f"coralloc(1) SYNOPSIS: the {len(usage)} lines of the usage")


def main():
    what, src, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
    if what == "options":
        check_options(src, cmd)
    elif what == "synopsis":
        check_synopsis(src, cmd)
    elif what == "examples":
        check_examples(src, sys.argv[4], sys.argv[5])
    else:
        fail("unknown check " + what)


main()
