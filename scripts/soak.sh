#!/usr/bin/env bash
# Soak: a long asynchronous job per strategy under seeded random SIGKILLs of random roles,
# then checks:
#   - the job finished (exit 0) and every failure in its report was recovered;
#   - `ftrec ckpt verify` passes on its final store (strategies that save);
#   - anonymous resident memory (RssAnon: the heap, stacks and arenas, where a leak shows) of
#     the long-lived processes (the coordinator, and every server and worker that lived
#     through the whole job) is flat: the least-squares slope of the samples after the first
#     20% of the job, times the sampled span, is below 5% of the mean RSS (or 2 MiB, whichever
#     is larger). VmRSS is reported too; it also counts the binary's code and data pages,
#     which grow by whatever code runs for the first time (the first restore, say), up to
#     the size of the binary;
#   - no file descriptors leak: a long-lived process ends with at most 4 more open fds
#     (/proc/PID/fd) than it had at the first sample after warm-up (connections in flight).
# Writes OUT/summary.md (a table, one row per strategy and long-lived process) and
# OUT/summary.txt (verdicts); exits non-zero if any check failed.
#
#   scripts/soak.sh --minutes 20 [--seed 7] [--kills 4] [--out soak-out]
#                   [--strategies full,deck,...] [--bin target/debug/ftrec]
#
# `none` is not soaked: its first server loss ends the job by design. The minutes are split
# evenly over the strategies; a job's step count comes from a short failure-free calibration
# run of the same strategy. Needs bash, jq and the ftrec binary (built with
# `cargo build -p ftrec-cli` if --bin is not given and target/debug/ftrec is missing).
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/.."

minutes=""
seed=7
kills=4
out="soak-out"
strategies="full,deck,ecrec,cpr,incrcp,incremental,cnr"
bin=""
servers=4
workers=2
sample_s=2

die() { echo "soak.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="${2:?--minutes needs a value}"; shift 2 ;;
        --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
        --kills) kills="${2:?--kills needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --strategies) strategies="${2:?--strategies needs a value}"; shift 2 ;;
        --bin) bin="${2:?--bin needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
# Paths given are relative to the directory the script was started from.
case "$out" in /*) ;; *) out="$here/$out" ;; esac
case "$bin" in /*|"") ;; *) bin="$here/$bin" ;; esac
[ -n "$minutes" ] || die "--minutes M is required"
[[ "$minutes" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--minutes $minutes is not a number"
[[ "$seed" =~ ^[0-9]+$ ]] || die "--seed $seed is not a non-negative integer"
[[ "$kills" =~ ^[0-9]+$ ]] || die "--kills $kills is not a non-negative integer"
command -v jq >/dev/null || die "jq is needed to read the run reports"
if [ -z "$bin" ]; then
    bin="$PWD/target/debug/ftrec"
    [ -x "$bin" ] || CARGO_INCREMENTAL=0 cargo build -p ftrec-cli
fi
[ -x "$bin" ] || die "--bin $bin is not an executable"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

IFS=, read -r -a strats <<<"$strategies"
for s in "${strats[@]}"; do
    case "$s" in
        full|deck|ecrec|cpr|incrcp|incremental|cnr) ;;
        none) die "--strategies: none cannot survive a kill (its first loss ends the job)" ;;
        *) die "--strategies: unknown strategy $s" ;;
    esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
budget_s=$(awk -v m="$minutes" -v n="${#strats[@]}" 'BEGIN { printf "%d", m * 60 / n }')
[ "$budget_s" -ge 10 ] || die "--minutes $minutes gives ${budget_s}s per strategy; at least 10s"
RANDOM=$seed

# The strategy's flags: a save every 10 steps; ecrec with two parities (two losses at once).
strategy_flags() {
    case "$1" in
        deck) echo "--strategy deck --delta-every-steps 10 --merge-stride 2" ;;
        ecrec) echo "--strategy ecrec --ec-k 2 --ec-r 2" ;;
        *) echo "--strategy $1 --ckpt-every-steps 10" ;;
    esac
}

# Least squares over "t value" lines on stdin: prints "slope_per_min mean span_s n".
fit() {
    awk '{ n++; sx += $1; sy += $2; sxx += $1 * $1; sxy += $1 * $2 }
        END {
            if (n < 3) { print "nan nan 0 " n; exit }
            d = n * sxx - sx * sx
            slope = (d == 0) ? 0 : (n * sxy - sx * sy) / d
            printf "%.3f %.1f %.1f %d\n", slope * 60, sy / n, tmax - tmin, n
        }
        NR == 1 { tmin = $1 } { tmax = $1 }'
}

# Sample RSS (KiB), open fds and anonymous RSS (KiB) of the coordinator and its children
# every $sample_s seconds, as "t_s pid role rss_kib fds anon_kib" lines, until the
# coordinator exits.
sampler() {
    local coord=$1 file=$2 t0
    t0=$(date +%s.%N)
    while kill -0 "$coord" 2>/dev/null; do
        local now pids p role rss fds anon
        now=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
        pids="$coord $(cat /proc/"$coord"/task/*/children 2>/dev/null || true)"
        for p in $pids; do
            if [ "$p" = "$coord" ]; then role=coordinator
            else role=$({ tr '\0' ' ' </proc/"$p"/cmdline; } 2>/dev/null | awk '{ print $2 }') || continue
            fi
            [ -n "$role" ] || continue
            read -r rss anon < <(awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 }
                END { print r, a }' /proc/"$p"/status 2>/dev/null) || continue
            [ -n "$rss" ] && [ -n "$anon" ] || continue
            fds=$(ls /proc/"$p"/fd 2>/dev/null | wc -l) || continue
            echo "$now $p $role $rss $fds $anon"
        done >>"$file"
        sleep "$sample_s"
    done
}

failed=0
summary="$out/summary.txt"
table="$out/summary.md"
: >"$summary"
{
    echo "| strategy | steps | wall s | kills fired / recovered | ckpt verify | process | RSS mean MiB | RSS slope KiB/min | anon mean MiB | anon slope KiB/min | fds start -> end | verdict |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$table"
note() { echo "$*" | tee -a "$summary"; }
note "soak: $minutes min over ${strats[*]} (${budget_s}s each), seed $seed, $kills kills per job, $servers servers, $workers workers, asynchronous, binary $bin"

for s in "${strats[@]}"; do
    dir="$out/$s"
    rm -rf "$dir"
    mkdir -p "$dir"
    # shellcheck disable=SC2046
    common=(run --preset tiny --servers "$servers" --workers "$workers" --seed "$seed"
        --eval-samples 512 $(strategy_flags "$s"))
    # Calibration: failure-free steps per second of this strategy.
    cal_steps=100
    t0=$(date +%s.%N)
    "$bin" "${common[@]}" --steps "$cal_steps" --work-dir "$dir/cal" >"$dir/cal.log" 2>&1 ||
        { note "$s: FAIL calibration run failed (see $dir/cal.log)"; failed=1; continue; }
    t1=$(date +%s.%N)
    rm -rf "$dir/cal"
    steps=$(awk -v n="$cal_steps" -v a="$t0" -v b="$t1" -v budget="$budget_s" \
        'BEGIN { s = int(0.8 * budget * n / (b - a)); if (s < 60) s = 60; print s }')
    # Seeded kills at distinct steps in the middle 80% of the job, at least steps/(2(k+1))
    # apart; roles server and worker (and the merger mid-merge for deck).
    kill_args=()
    must_fire=0
    last=0
    gap=$((steps / (2 * (kills + 1))))
    for ((i = 1; i <= kills; i++)); do
        at=$((steps * i / (kills + 1) + RANDOM % (gap + 1) - gap / 2))
        [ "$at" -gt "$last" ] || at=$((last + 1))
        [ "$at" -lt "$steps" ] || at=$((steps - 1))
        last=$at
        roll=$((RANDOM % 10))
        if [ "$s" = deck ] && [ "$roll" -eq 0 ]; then
            kill_args+=(--kill "merger=0@phase=merge#$((1 + RANDOM % 3))")
        elif [ "$roll" -lt 7 ]; then
            kill_args+=(--kill "server=$((RANDOM % servers))@step=$at")
            must_fire=$((must_fire + 1))
        else
            kill_args+=(--kill "worker=$((RANDOM % workers))@step=$at")
            must_fire=$((must_fire + 1))
        fi
    done
    store="$dir/store"
    store_args=()
    [ "$s" = ecrec ] || store_args=(--store "$store")
    note "$s: $steps steps, kills: ${kill_args[*]}"
    t0=$(date +%s.%N)
    "$bin" "${common[@]}" --steps "$steps" --work-dir "$dir/work" "${store_args[@]}" \
        "${kill_args[@]}" --json "$dir/report.json" >"$dir/run.log" 2>&1 &
    coord=$!
    sampler "$coord" "$dir/samples.txt" &
    sampler_pid=$!
    rc=0
    wait "$coord" || rc=$?
    wait "$sampler_pid" || true
    t1=$(date +%s.%N)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
    ok=1
    if [ "$rc" -ne 0 ]; then
        note "$s: FAIL the job exited with $rc: $(grep 'error' "$dir/run.log" | tail -1)"
        ok=0
    fi
    fired="-"
    if [ -f "$dir/report.json" ]; then
        n_fail=$(jq '[.failures[]] | length' "$dir/report.json")
        n_rec=$(jq '[.failures[] | select(.recovered_s != null)] | length' "$dir/report.json")
        fired="$n_fail / $n_rec"
        if [ "$n_fail" -ne "$n_rec" ]; then
            note "$s: FAIL $((n_fail - n_rec)) of $n_fail failures not recovered"
            ok=0
        fi
        # A merger kill fires only if that merge pass happens; step kills always fire.
        if [ "$n_fail" -lt "$must_fire" ]; then
            note "$s: FAIL only $n_fail of $must_fire step kills fired"
            ok=0
        fi
    elif [ "$rc" -eq 0 ]; then
        note "$s: FAIL no report"
        ok=0
    fi
    verify="n/a (in memory)"
    if [ "$s" != ecrec ]; then
        if "$bin" ckpt verify "$store" >"$dir/verify.log" 2>&1; then
            verify="ok ($(grep -c '^ok' "$dir/verify.log") checkpoints)"
        else
            verify="FAIL"
            note "$s: FAIL ckpt verify: $(grep -v '^ok' "$dir/verify.log" | head -1)"
            ok=0
        fi
    fi
    # Long-lived: the coordinator and every process sampled from the first to the last
    # sample (a server never killed). Workers are long-lived too unless killed.
    first_t=$(awk 'NR == 1 { print $1 }' "$dir/samples.txt")
    last_t=$(awk 'END { print $1 }' "$dir/samples.txt")
    warm=$(awk -v a="$first_t" -v b="$last_t" 'BEGIN { print a + 0.2 * (b - a) }')
    for pid in $(awk '{ print $2 }' "$dir/samples.txt" | sort -un); do
        role=$(awk -v p="$pid" '$2 == p { print $3; exit }' "$dir/samples.txt")
        span=$(awk -v p="$pid" '$2 == p { if (!s) s = $1; e = $1 } END { print s, e }' \
            "$dir/samples.txt")
        read -r ps pe <<<"$span"
        awk -v ps="$ps" -v pe="$pe" -v a="$first_t" -v b="$last_t" -v st="$sample_s" \
            'BEGIN { exit !(ps <= a + 2 * st && pe >= b - 2 * st) }' || continue
        [ "$role" = coordinator ] || [ "$role" = server ] || [ "$role" = worker ] || continue
        read -r slope mean span_s n < <(awk -v p="$pid" -v w="$warm" \
            '$2 == p && $1 >= w { print $1, $4 }' "$dir/samples.txt" | fit)
        read -r aslope amean _ _ < <(awk -v p="$pid" -v w="$warm" \
            '$2 == p && $1 >= w { print $1, $6 }' "$dir/samples.txt" | fit)
        fd0=$(awk -v p="$pid" -v w="$warm" '$2 == p && $1 >= w { print $5; exit }' "$dir/samples.txt")
        fd1=$(awk -v p="$pid" '$2 == p { f = $5 } END { print f }' "$dir/samples.txt")
        verdict=ok
        if [ "$n" -ge 3 ]; then
            awk -v s="$aslope" -v m="$mean" -v sp="$span_s" \
                'BEGIN { g = s * sp / 60; lim = 0.05 * m; if (lim < 2048) lim = 2048; exit !(g < lim) }' ||
                { verdict="memory grows"; ok=0; }
        else
            verdict="too few samples"
        fi
        if [ -n "$fd0" ] && [ $((fd1 - fd0)) -gt 4 ]; then
            verdict="$verdict; fds grow"
            ok=0
        fi
        mib=$(awk -v m="$mean" 'BEGIN { printf "%.1f", m / 1024 }')
        amib=$(awk -v m="$amean" 'BEGIN { printf "%.1f", m / 1024 }')
        echo "| $s | $steps | $wall | $fired | $verify | $role $pid | $mib | $slope | $amib | $aslope | $fd0 -> $fd1 | $verdict |" >>"$table"
        [ "$verdict" = ok ] || note "$s: FAIL $role $pid: $verdict (anon slope $aslope KiB/min, RSS slope $slope KiB/min, mean RSS $mib MiB, fds $fd0 -> $fd1)"
    done
    if [ "$ok" -eq 1 ]; then note "$s: ok ($wall s, failures fired/recovered $fired, verify $verify)"; else failed=1; fi
done
note "table: $table"
if [ "$failed" -ne 0 ]; then note "soak: FAILED"; exit 1; fi
note "soak: passed"
