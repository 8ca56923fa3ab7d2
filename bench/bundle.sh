#!/usr/bin/env bash
# Packs kvserver, kvcli and kvbench with every shared library they load (the C library and its
# loader included) into one directory that runs on another x86-64 Linux machine without
# rdkv's build dependencies: a bigger host for the benchmarks (e.g. one core set per server,
# bench/replication-bench.sh --server-cpus), where RocksDB, glog, gflags... are not installed.
#
#   bench/bundle.sh [--build DIR] OUT_DIR
#
# OUT_DIR gets the same layout as a build directory (server/kvserver, tools/kvcli,
# bench/kvbench/kvbench), so the bench scripts take it as --build OUT_DIR. Each of those is a
# small sh script that starts the real (stripped) binary in OUT_DIR/bin through the packed
# loader with --library-path OUT_DIR/lib: the process keeps the script's PID (exec), so
# /proc/PID figures and signals work as with the plain binary. Needs ldd, strip and sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=bundle.sh
die() { echo "$PROG: error: $*" >&2; exit 2; }
BUILD=""
while (($# > 0)); do
  case $1 in
    -h | --help) sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --build) (($# >= 2)) || die "--build needs a value"; BUILD=$2; shift 2 ;;
    -*) die "unknown option '$1' (--help)" ;;
    *) break ;;
  esac
done
(($# == 1)) || die "usage: bench/bundle.sh [--build DIR] OUT_DIR"
OUT=$1
if [[ -z $BUILD ]]; then
  BUILD=build/ci
  [[ -x $BUILD/server/kvserver ]] || BUILD=build/default
fi
bins=(server/kvserver tools/kvcli bench/kvbench/kvbench)
for b in "${bins[@]}"; do
  [[ -x $BUILD/$b ]] || die "$BUILD/$b not found; build it: cmake --build $BUILD --target kvserver kvcli kvbench"
done
for t in ldd strip; do command -v "$t" >/dev/null || die "$t is needed"; done

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
loader=""
for b in "${bins[@]}"; do
  name=$(basename "$b")
  strip -o "$OUT/bin/$name" "$BUILD/$b"
  # ldd lines: "libx.so.1 => /path (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso...".
  while read -r lib; do
    [[ -n $lib && -f $lib ]] || continue
    cp -L -n "$lib" "$OUT/lib/$(basename "$lib")"
    if [[ $(basename "$lib") == ld-linux* ]]; then loader=$(basename "$lib"); fi
  done < <(ldd "$BUILD/$b" | awk '$2 == "=>" {print $3} $2 != "=>" && $1 ~ /^\// {print $1}')
  mkdir -p "$OUT/$(dirname "$b")"
  # The wrapper: the loader from the bundle, the libraries from the bundle, nothing from the host.
  cat >"$OUT/$b" <<EOF
#!/bin/sh
d=\$(cd "\$(dirname "\$0")/$(dirname "$b" | sed 's#[^/]*#..#g')" && pwd)
exec "\$d/lib/LOADER" --library-path "\$d/lib" "\$d/bin/$name" "\$@"
EOF
  chmod +x "$OUT/$b"
done
[[ -n $loader ]] || die "ldd named no ELF loader (ld-linux*): is this a static build?"
for b in "${bins[@]}"; do sed -i "s#/LOADER\"#/$loader\"#" "$OUT/$b"; done
# Smoke test here: every wrapper starts its program.
# (--help exits 0 or 1 by program; a loader or library failure is 127.)
for b in "${bins[@]}"; do
  rc=0
  "$OUT/$b" --help >/dev/null 2>"$OUT/help.err" || rc=$?
  ((rc <= 2)) || { cat "$OUT/help.err" >&2; die "$OUT/$b --help exited $rc"; }
done
rm -f "$OUT/help.err"
echo "$PROG: $OUT ($(du -sh "$OUT" | cut -f1)): ${bins[*]} with $(ls "$OUT/lib" | wc -l) libraries, loader $loader"
