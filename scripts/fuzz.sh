#!/usr/bin/env bash
# Short fuzzing run of every target in fuzz/ (cargo-fuzz, libFuzzer).
#
#   scripts/fuzz.sh [seconds-per-target]     (default 30)
#   FUZZ_TARGETS="request_scan glob" scripts/fuzz.sh 10
#
# The `config` target builds the whole server with sanitizers (minutes);
# it runs when FUZZ_TARGETS names it (the default list does).
#
# Builds the targets, runs each for a fixed time from its committed seed
# corpus, prints one summary line per target, and exits non-zero if any
# target crashed, leaked, or timed out (the crashing input is kept under
# fuzz/artifacts/<target>/). New inputs the fuzzer finds go to a scratch
# corpus, so the committed seeds stay small and reviewed.
#
# Needs a nightly toolchain (libFuzzer needs -Zsanitizer). Installs
# cargo-fuzz if missing; if no nightly can be used at all, says so and exits
# 0, because fuzzing is an extra on a machine that cannot build it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:-30}
read -r -a TARGETS <<< "${FUZZ_TARGETS:-request_scan descriptor config glob}"
FEATURES=()
for t in "${TARGETS[@]}"; do [ "$t" = config ] && FEATURES=(--features server); done
# A single input taking this long is a bug (e.g. exponential glob matching).
TIMEOUT_S=${FUZZ_TIMEOUT_S:-10}
RSS_LIMIT_MB=${FUZZ_RSS_LIMIT_MB:-2048}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

case "$SECONDS_PER_TARGET" in
  '' | *[!0-9]*) echo "usage: $0 [seconds-per-target]" >&2; exit 2 ;;
esac

# --- Toolchain: rustup nightly, else RUSTC_BOOTSTRAP on the default one -----
TOOLCHAIN=()
if command -v rustup >/dev/null && rustup run nightly rustc --version >/dev/null 2>&1; then
  TOOLCHAIN=(+nightly)
elif command -v rustup >/dev/null && rustup toolchain install nightly --profile minimal >/dev/null 2>&1; then
  TOOLCHAIN=(+nightly)
elif command -v rustc >/dev/null && RUSTC_BOOTSTRAP=1 rustc -Zunstable-options --version >/dev/null 2>&1; then
  # Unsupported escape hatch: lets a stable compiler accept -Zsanitizer.
  echo "fuzz: no nightly toolchain; using RUSTC_BOOTSTRAP=1 with $(rustc --version)"
  export RUSTC_BOOTSTRAP=1
else
  echo "fuzz: SKIPPED: no nightly Rust toolchain can be used (install one: rustup toolchain install nightly)"
  exit 0
fi

# libfuzzer-sys compiles libFuzzer itself, which needs a C++ compiler.
if ! command -v c++ >/dev/null && ! command -v clang++ >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq g++ >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

# --- Build, then run each target ---------------------------------------------
for t in "${TARGETS[@]}"; do
  cargo "${TOOLCHAIN[@]}" fuzz build --fuzz-dir fuzz "${FEATURES[@]}" "$t"
done

SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
failed=()
for t in "${TARGETS[@]}"; do
  mkdir -p "$SCRATCH/$t"
  log="$SCRATCH/$t.log"
  rc=0
  # The scratch dir comes first: libFuzzer writes new inputs there only.
  cargo "${TOOLCHAIN[@]}" fuzz run --fuzz-dir fuzz "${FEATURES[@]}" "$t" "$SCRATCH/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT_S" \
    -rss_limit_mb="$RSS_LIMIT_MB" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" -eq 0 ]; then
    status=ok
  else
    status="FAILED (exit $rc)"
    failed+=("$t")
    grep -E '^(==[0-9]+==|thread .* panicked|SUMMARY|artifact_prefix|Test unit written)' "$log" | head -20 || true
  fi
  printf 'fuzz %-13s %-18s %6ss  execs %-10s exec/s %-8s cov %s\n' \
    "$t" "$status" "$SECONDS_PER_TARGET" "${execs:-?}" "${rate:-?}" "${cov:-?}"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (inputs under $ROOT/fuzz/artifacts/)"
  exit 1
fi
echo "fuzz: all targets ok"
