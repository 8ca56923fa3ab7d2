#!/usr/bin/env python3
"""Runs every compile command of a configured build with -fsyntax-only.

    tests/util/syntax_check.py BUILD_DIR [JOBS]

Used by tests/run-all.sh's `tsa` stage: clang's thread-safety analysis (-Wthread-safety) runs in
the front end, so checking the locking annotations needs no code generation and no linking. Each
translation unit of BUILD_DIR/compile_commands.json is compiled with its own flags plus
-fsyntax-only (output and dependency-file options dropped), JOBS at a time (default: CPUs).
Any diagnostic that fails a compile (the build's -Werror turns warnings into errors) fails the
run; the failing commands' output is printed. Exit 0 only when every unit compiled.
"""
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys

# Options that name an output or a dependency file, each followed by its argument.
_WITH_ARGUMENT = {"-o", "-MF", "-MT", "-MQ"}
_ALONE = {"-MD", "-MMD"}


def syntax_only(argv):
    out = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _WITH_ARGUMENT:
            skip = True
            continue
        if arg in _ALONE:
            continue
        out.append(arg)
    out.insert(1, "-fsyntax-only")
    return out


def check(entry):
    argv = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    proc = subprocess.run(syntax_only(argv), cwd=entry["directory"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return entry["file"], proc.returncode, proc.stdout


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = os.path.join(sys.argv[1], "compile_commands.json")
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        print(f"syntax_check: cannot read {path}: {e} (configure the build first)", file=sys.stderr)
        return 2
    if not entries:
        print(f"syntax_check: {path} lists no translation unit", file=sys.stderr)
        return 2
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for file, rc, output in pool.map(check, entries):
            if rc != 0:
                failed += 1
                print(f"syntax_check: FAILED {file} (exit {rc})\n{output}", flush=True)
            elif output.strip():
                print(output, end="", flush=True)
    print(f"syntax_check: {len(entries) - failed}/{len(entries)} translation units passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
