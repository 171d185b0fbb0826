#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS each, one after the other, and prints each
# target's final libFuzzer statistics (executions, coverage, exec/s).
#
#   fuzz/run.sh SECONDS [TARGET ...]
#
# Needs only the stable toolchain: cargo-fuzz is installed from crates.io when missing, and
# RUSTC_BOOTSTRAP=1 lets stable rustc accept the -Z flags cargo-fuzz passes (sanitizer,
# coverage instrumentation). Targets are built optimized with debug assertions and overflow
# checks (`-O -a`: an overflow is a finding even where a release build would wrap) and with
# AddressSanitizer (cargo-fuzz's default); SANITIZER=none runs them without it.
#
# Corpora grow in fuzz/corpus/TARGET (not checked in); the IR parser also starts from every
# file under ir/ and the token dictionary fuzz/ir.dict, the ONNX importer from the models
# under tests/onnx and fuzz/seeds/onnx_import, and every target from its checked-in seeds in
# fuzz/seeds/TARGET (inputs carrying NaN and ±Inf: kernel_vs_reference, engine_api,
# onnx_import). A crash leaves its input in
# fuzz/artifacts/TARGET and stops the script with libFuzzer's exit code; each log is kept in
# fuzz/logs/TARGET.log.
set -euo pipefail

if [[ $# -lt 1 || ! $1 =~ ^[0-9]+$ ]]; then
    echo "usage: $0 SECONDS [TARGET ...]" >&2
    exit 2
fi
seconds=$1
shift
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
sanitizer=${SANITIZER:-address}

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(cargo fuzz list)
fi

mkdir -p logs
cargo fuzz build -O -a --sanitizer "$sanitizer"

summary=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    seeds=()
    options=(-max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1)
    if [[ $target == parse_roundtrip ]]; then
        seeds=(../ir)
        options+=(-dict=ir.dict -max_len=8192)
    elif [[ $target == onnx_import ]]; then
        # Real models: the families, the zoo blocks and the ONNX node tests' models (and their
        # data), and a model per op of issue 55 behind the mode byte (seeds/onnx_import).
        seeds=(../tests/onnx/families ../tests/onnx/node ../tests/onnx/zoo seeds/onnx_import)
        options+=(-max_len=131072)
    fi
    # Checked-in seeds: ops whose data carry NaN and ±Inf (a seed with both top bits set,
    # `primjit_fuzz::carries_specials`), an ONNX model whose initializers hold them.
    if [[ -d seeds/$target ]]; then
        seeds+=("seeds/$target")
    fi
    echo "== $target: $seconds s" >&2
    status=0
    cargo fuzz run -O -a --sanitizer "$sanitizer" "$target" "corpus/$target" "${seeds[@]}" -- \
        "${options[@]}" >"logs/$target.log" 2>&1 || status=$?
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "logs/$target.log" | tail -1 || true)
    runs=$(grep -E '^stat::number_of_executed_units:' "logs/$target.log" | tail -1 |
        awk '{print $2}' || true)
    if [[ $status -ne 0 ]]; then
        echo "$target: FAILED (exit $status), see fuzz/logs/$target.log and fuzz/artifacts/$target" >&2
        tail -40 "logs/$target.log" >&2
        exit "$status"
    fi
    summary+=("$target: ${seconds} s, ${runs:-?} executions; ${done_line:-no DONE line}")
done

echo "== summary"
printf '%s\n' "${summary[@]}"
