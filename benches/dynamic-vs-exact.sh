#!/usr/bin/env bash
# Per-layer speed of the `dynamic` policy against `exact` on the ResNet34 trunk, robust to a
# shared machine: `primjit bench-op --model --dynamic` already pairs each dynamic run with an
# exact run next to it and reports the median of the per-run ratios; this script repeats that
# in several fresh processes (each with its own code and buffer placement) and prints, per
# node, the median of the processes' ratios.
#
# Usage: benches/dynamic-vs-exact.sh WIDTH [PROCESSES] [RUNS]   (defaults: 5 processes, 6 runs)
# Needs a release build: cargo build --release -p primjit-cli
set -euo pipefail
cd "$(dirname "$0")/.."
width=${1:?usage: benches/dynamic-vs-exact.sh WIDTH [PROCESSES] [RUNS]}
processes=${2:-5}
runs=${3:-6}
primjit=target/release/primjit
[[ -x $primjit ]] || { echo "build first: cargo build --release -p primjit-cli" >&2; exit 1; }

for _ in $(seq "$processes"); do
    "$primjit" bench-op --model ir/resnet34_trunk.ir --dims "W=$width" --threads 1 \
        --dynamic --runs "$runs" |
        awk '$1 ~ /^(conv|maxpool|layer)/ { print NR, $1, $2, $3, $4 }'
done | awk -v width="$width" -v processes="$processes" -v runs="$runs" '
    {
        order[$2] = $1; name[$1] = $2
        n[$2]++; ratio[$2, n[$2]] = $5; exact[$2, n[$2]] = $3; dyn[$2, n[$2]] = $4
    }
    function median(kind, node,    i, j, t, v, k) {
        k = n[node]
        for (i = 1; i <= k; i++) v[i] = (kind == "r") ? ratio[node, i] : (kind == "e") ? exact[node, i] : dyn[node, i]
        for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        return v[int((k + 1) / 2)]
    }
    END {
        printf "W=%d: %d processes x %d runs; per node, medians over processes\n", width, processes, runs
        printf "%-22s %9s %9s %7s\n", "node", "exact ms", "dyn ms", "dyn/ex"
        for (line = 1; line <= 1000; line++) {
            if (!(line in name)) continue
            node = name[line]
            r = median("r", node)
            total++; if (r <= 1.03) within++; if (r < 0.97) faster++
            printf "%-22s %9.3f %9.3f %7.3f\n", node, median("e", node), median("d", node), r
        }
        printf "%d of %d nodes at most 3%% slower than exact (%d of them more than 3%% faster)\n", within, total, faster
    }'
