#!/usr/bin/env bash
# Runs gpumem's fuzz targets (fuzz/, issue 16) with cargo-fuzz on nightly Rust.
#
#   scripts/fuzz.sh SECONDS [JOBS] [TARGET...]
#
# Each target (default: all) runs SECONDS of wall time on JOBS processes (libFuzzer's fork
# mode; default 1), with a 4 GiB RSS limit and a 10 s limit per input, from a corpus seeded with
# the repository's fixtures (and ../shared/groundtruth/external/ where it exists) in
# fuzz/corpus/TARGET. A finding is saved in fuzz/artifacts/TARGET/ and the script exits 1.
# Needs `rustup toolchain install nightly` and `cargo install cargo-fuzz --locked`.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: scripts/fuzz.sh SECONDS [JOBS] [TARGET...]}
jobs=${2:-1}
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(pickle snapshot_json trace workload alloc_conf)

# seeds: files of at most 1 MiB, copied under their content's hash (idempotent)
seed() {
    local t=$1
    shift
    mkdir -p "fuzz/corpus/$t"
    for f in "$@"; do
        [ -f "$f" ] || continue
        [ "$(stat -c %s "$f")" -le 1048576 ] || continue
        cp "$f" "fuzz/corpus/$t/seed-$(sha1sum "$f" | cut -c1-16)"
    done
}
shopt -s nullglob globstar
seed pickle fixtures/**/*.pickle fixtures/**/*.pkl ../shared/groundtruth/external/*.pickle
seed snapshot_json fixtures/snapshots/**/*.json fixtures/external/**/*.json \
    ../shared/groundtruth/external/*.json fixtures/bad/corpus/*.json
seed trace fixtures/allocator/*.json
seed workload fixtures/workloads/**/*.toml fixtures/hf/**/*.toml fixtures/vision/**/*.toml \
    fixtures/bad/corpus/*.toml
mkdir -p fuzz/corpus/alloc_conf
for c in "expandable_segments:True" "max_split_size_mb:128,garbage_collection_threshold:0.6" \
    "roundup_power2_divisions:[256:1,512:2,>:8]" "roundup_power2_divisions:4" \
    "backend:cudaMallocAsync" "24GiB" "1.5 GB" "1073741824" "80GiB"; do
    printf '%s' "$c" > "fuzz/corpus/alloc_conf/seed-$(printf '%s' "$c" | sha1sum | cut -c1-16)"
done

status=0
for t in "${targets[@]}"; do
    echo "== fuzz $t: ${secs}s on $jobs process(es)"
    mkdir -p "fuzz/artifacts/$t"
    if ! cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -fork="$jobs" -rss_limit_mb=4096 -timeout=10 \
        -max_len=1048576 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/"; then
        echo "fuzz $t: a finding, saved in fuzz/artifacts/$t/" >&2
        status=1
    fi
done
exit $status
