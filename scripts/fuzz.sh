#!/usr/bin/env bash
# Builds the libFuzzer targets of the tools package Tools/ (AddressSanitizer, own scratch path
# .build-fuzz, which builds the root package's modules with the same instrumentation) and runs each
# for SECONDS on a temporary copy of its seed corpus (Fuzz/corpus/NAME is never written).
# Prints each target's execution count; exits non-zero if any target crashed, leaked or
# broke one of its properties, keeping the input under .build-fuzz/fuzz-failures/.
# Usage: bash scripts/fuzz.sh [SECONDS]     (default 60; the test command runs 15)
source "$(dirname "$0")/setup.sh"

seconds=${1:-60}
# `--sanitize=fuzzer --sanitize=address` links libFuzzer and ASan, but the Swift driver hands
# the frontend only the last -sanitize= it sees, so Swift code would get ASan and no coverage
# (libFuzzer: "no interesting inputs ... Is the code instrumented?"). The combined
# -Xswiftc flag comes last and instruments every Swift module with both.
build=(swift build --package-path Tools --sanitize=fuzzer --sanitize=address -Xswiftc -sanitize=fuzzer,address
    --scratch-path .build-fuzz)
for product in fuzz-token-response fuzz-store-decoder fuzz-error-text fuzz-loopback-request; do
    "${build[@]}" --product "$product"
done
bin=$("${build[@]}" --show-bin-path)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# run NAME PRODUCT [libFuzzer flags...]
run() {
    local name=$1 product=$2
    shift 2
    mkdir -p "$work/$name/corpus" "$work/$name/artifacts"
    cp Fuzz/corpus/"$name"/* "$work/$name/corpus/"
    local log="$work/$name/log" status=0
    # The Swift backtracer would hold a crashing fuzzer for its own report: libFuzzer and
    # ASan report instead.
    SWIFT_BACKTRACE=enable=no \
        ASAN_OPTIONS=detect_leaks=1 \
        LSAN_OPTIONS="suppressions=$PWD/Fuzz/lsan.supp:print_suppressions=0" \
        "$bin/$product" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$work/$name/artifacts/" "$@" "$work/$name/corpus" >"$log" 2>&1 || status=$?
    local executions
    executions=$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log" | tail -1)
    local corpus
    corpus="corpus $(ls "$work/$name/corpus" | wc -l) inputs from $(ls Fuzz/corpus/"$name" | wc -l) seeds"
    if [ "$status" -eq 0 ] && [ -z "$(ls -A "$work/$name/artifacts")" ]; then
        echo "$name: ${executions:-?} executions in $seconds s, $corpus"
    else
        echo "$name: ${executions:-?} executions, then FAILED (exit $status), $corpus" >&2
        failures=$((failures + 1))
        local kept=.build-fuzz/fuzz-failures/$name
        rm -rf "$kept" && mkdir -p "$kept"
        cp "$work/$name/artifacts/"* "$kept/" 2>/dev/null || true
        cp "$log" "$kept/fuzz.log"
        grep -E "Fatal error|ERROR: |SUMMARY: |#[0-9]+ 0x[0-9a-f]+ in .* $PWD/(Tools/)?Sources/" "$log" | head -20 >&2 || true
        for input in "$kept"/crash-* "$kept"/leak-* "$kept"/timeout-* "$kept"/oom-*; do
            if [ -e "$input" ]; then echo "  reproduce: SWIFT_BACKTRACE=enable=no $bin/$product $input" >&2; fi
        done
        echo "  full log: $kept/fuzz.log" >&2
    fi
}

run token-response fuzz-token-response -dict=Fuzz/token-response.dict
run store-decoder fuzz-store-decoder
run error-text fuzz-error-text -dict=Fuzz/error-text.dict
run loopback-request fuzz-loopback-request -dict=Fuzz/loopback-request.dict

if [ "$failures" -ne 0 ]; then
    echo "fuzzing: $failures of 4 targets failed" >&2
    exit 1
fi
echo "fuzzing: 4 targets, no crash, leak or property violation"
