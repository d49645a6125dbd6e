#!/usr/bin/env bash
# Static analysis:   bash tests/analyze.sh [BUILD_DIR]
#
# The tree's format (clang-format --dry-run against .clang-format, with the
# clang-format Debian 12 ships, 14: another version may format otherwise),
# the API reference made from the headers (docs/gen_reference.py --check),
# cppcheck (warning and portability checks) and clang-tidy (the checks in
# .clang-tidy, each left-out one with its reason there) over every source
# file of the library as this platform builds it (from a compile database
# configured in BUILD_DIR, default build/analyze). Any finding fails it. A
# finding that is wrong is suppressed where it stands, with the reason
# (`// cppcheck-suppress <id>` or `// NOLINT(<check>)`). The last line is
# "analysis: ok" or "analysis: N finding(s)".
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build/analyze}
jobs=${ATAP_JOBS:-2}

for tool in clang-format cppcheck clang-tidy clang; do
    command -v "$tool" >/dev/null 2>&1 || { echo "analyze: $tool not found"; echo "analysis: 1 finding(s)"; exit 1; }
done
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DATAP_BUILD_TESTS=OFF -DATAP_BUILD_EXAMPLES=OFF \
    -DATAP_BUILD_BENCH=OFF >/dev/null || { echo "analysis: 1 finding(s)"; exit 1; }
# The library's own sources, as the compile database names them.
mapfile -t files < <(sed -nE 's/^ *"file": "([^"]*\/src\/[^"]*\.c)",?$/\1/p' "$build/compile_commands.json" | sort -u)
[ ${#files[@]} -gt 0 ] || { echo "analyze: no source in $build/compile_commands.json"; echo "analysis: 1 finding(s)"; exit 1; }

findings=0
# The C and C++ files of the tree (git's list when this is a clone).
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
    mapfile -t sources < <(git -C "$root" ls-files '*.c' '*.h' '*.cpp' '*.hpp' | grep -v '^tests/corpus/')
else
    mapfile -t sources < <(cd "$root" && find src include tests examples bench \( -name '*.[ch]' -o -name '*.[ch]pp' \) | grep -v '^tests/corpus/')
fi
out=$(cd "$root" && clang-format --dry-run "${sources[@]}" 2>&1 | grep -E ': (warning|error): ' | sed -E 's/: (warning|error): .*//' | sort -u)
if [ -n "$out" ]; then
    echo "analyze: not formatted as .clang-format says (clang-format -i <file> fixes it):"
    echo "$out"
    findings=$((findings + $(echo "$out" | wc -l)))
fi
echo "analyze: clang-format over ${#sources[@]} files done"
# The API reference (docs/reference/) is what the headers make, and every
# public call has its comment (docs/gen_reference.py; CTest test_reference
# runs the same check).
if command -v python3 >/dev/null 2>&1; then
    out=$(python3 "$root/docs/gen_reference.py" --check | grep -v ' calls in ')
    if [ -n "$out" ]; then
        echo "$out"
        findings=$((findings + $(echo "$out" | wc -l)))
    fi
    echo "analyze: docs/gen_reference.py --check done"
fi
# Every atomic operation in src/ names its order through atomics.h's forms
# (ld_acquire, casw_release, ...): a raw atomic_*_explicit call, a fence,
# an implicit seq_cst call (atomic_load, atomic_fetch_add, ...) or a
# compiler builtin (__atomic_*, __sync_*) elsewhere is a finding.
out=$(cd "$root" && grep -nE '\batomic_(load|store|exchange|fetch_[a-z]+|compare_exchange_(weak|strong)|flag_test_and_set|flag_clear)(_explicit)?[[:space:]]*\(|\batomic_(thread|signal)_fence[[:space:]]*\(|\b__(atomic|sync)_[a-z_]+[[:space:]]*\(' \
    $(git -C "$root" ls-files 'src/*.c' 'src/*.h' 2>/dev/null || find src -name '*.[ch]') | grep -v '^src/atomics.h:')
if [ -n "$out" ]; then
    echo "analyze: an atomic operation not through src/atomics.h:"
    echo "$out"
    findings=$((findings + $(echo "$out" | wc -l)))
fi
echo "analyze: atomics through src/atomics.h done"
out=$(cppcheck --quiet --enable=warning,portability --inline-suppr --std=c11 \
    -I "$root/include" -I "$root/src" --error-exitcode=0 "${files[@]}" 2>&1 | grep -E '^[^ ].*: (error|warning|portability):')
if [ -n "$out" ]; then
    echo "$out"
    findings=$((findings + $(echo "$out" | wc -l)))
fi
echo "analyze: cppcheck over ${#files[@]} files done"

# A build with x86 shadow stacks (-fcf-protection=full) must not use the
# hand-written stack switch, which returns on another stack (src/fiber.c).
if [ "$(uname -m)" = x86_64 ]; then
    obj=$(mktemp) || exit 1
    if ! gcc -std=c11 -D_GNU_SOURCE -O1 -fcf-protection=full -I "$root/include" -I "$root/src" -c "$root/src/fiber.c" \
        -o "$obj" 2>&1 || nm "$obj" | grep -q 'atap__fiber_jump'; then
        echo "analyze: src/fiber.c built with -fcf-protection=full keeps the hand-written switch"
        findings=$((findings + 1))
    fi
    rm -f "$obj"
    echo "analyze: fiber.c under shadow stacks done"
fi

tidy_log=$build/clang-tidy.log
# One file per clang-tidy: clang-tidy 14's analyzer carries something from
# one file to the next in one run (read.c, then runtime.c: a va_list
# "uninitialized" in init_fail, which neither shows alone), so a finding
# would come and go as files are added and the groups shift.
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -n 1 clang-tidy -p "$build" --quiet >"$tidy_log" 2>/dev/null
out=$(grep -E ': (error|warning): ' "$tidy_log" | sort -u)
if [ -n "$out" ]; then
    echo "$out"
    findings=$((findings + $(echo "$out" | wc -l)))
fi
echo "analyze: clang-tidy over ${#files[@]} files done"

if [ "$findings" -eq 0 ]; then
    echo "analysis: ok"
else
    echo "analysis: $findings finding(s)"
    exit 1
fi
