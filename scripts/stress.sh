#!/usr/bin/env bash
# The stress tier (issue 29, point 10): the suites where a lost session would show — the
# rotation race, the refresh lease across processes, the store faults, the OAuth authority
# against the real Authlib server, the multi-process suites — run ROUNDS times beside CPU
# burners (BURNERS busy loops per core), each round a fresh `swift test` process. Prints, per
# round, the suites' result, and at the end the rounds run, the failures by test, and the
# sessions lost (a rotation-race or multi-process test that reports one). Optional: not part of
# the whole suite (scripts/test.sh --stress runs it after the quick tier's build). Also the
# suites whose tests act while a server holds an answer or a process runs (the killed refresh,
# the fault matrix, discovery on first use, the device flow): none may fail for being slow.
# Usage: bash scripts/stress.sh [ROUNDS] [BURNERS]      (defaults 50 and 2)
source "$(dirname "$0")/setup.sh"
rounds=${1:-50}
burners=${2:-2}
filter='ArrivingAnswerTests|RotationRaceTests|RefreshLeaseTests|StoreFaultTests|OAuthAuthorityTests|MultiProcessTests|SharedStoreTests|KilledRefreshTests|FaultMatrixTests|IssuerAuthorityTests|DeviceFlowTests'

swift build --build-tests -Xswiftc -warnings-as-errors
swift build --package-path Tools --product session-probe -Xswiftc -warnings-as-errors
export SESSIONFLOW_PROBE="$PWD/Tools/.build/debug/session-probe"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq 1 $(($(nproc) * burners))); do
    (while :; do :; done) &
    pids+=($!)
done

logs=$(mktemp -d)
failed_rounds=0
for round in $(seq 1 "$rounds"); do
    log="$logs/round-$round.log"
    if swift test --skip-build --filter "$filter" >"$log" 2>&1; then
        echo "round $round: passed ($(grep -oE 'with [0-9]+ tests' "$log" | tail -1))"
    else
        failed_rounds=$((failed_rounds + 1))
        echo "round $round: FAILED: $(grep -oE '✘ Test [A-Za-z0-9_]+\(' "$log" | sort -u | tr '\n' ' ')"
        cp "$log" "$logs/failed-$round.log"
    fi
done
cleanup
echo
echo "stress: $rounds rounds beside $((${#pids[@]})) busy loops; $failed_rounds rounds failed"
echo "failures by test:"
cat "$logs"/failed-*.log 2>/dev/null | grep -oE '✘ Test [A-Za-z0-9_]+\(' | sort | uniq -c | sort -rn || true
# The rotation-race tests print "rotation race, one process: N lost sessions in R rounds" (and
# "two processes") in every round, passed or not.
cat "$logs"/round-*.log | grep -oE 'rotation race, (one|two) process(es)?: [0-9]+ lost sessions in [0-9]+ rounds' |
    awk -F': ' '{ split($2, w, " "); lost[$1] += w[1]; races[$1] += w[5] }
        END { for (k in lost) printf "%s: %d lost sessions in %d races\n", k, lost[k], races[k] }'
echo "rounds with a session lost: $(grep -lE 'lost the session|: [1-9][0-9]* lost sessions' "$logs"/round-*.log 2>/dev/null | wc -l)"
echo "logs of failed rounds: $logs"
[ "$failed_rounds" -eq 0 ]
