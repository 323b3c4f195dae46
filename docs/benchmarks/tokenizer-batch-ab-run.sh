#!/usr/bin/env bash
# Two builds of the tokenizer package's benchmarks alternated: EncodeBatch on
# the 20 MB of Go text on all cores, ROUNDS (default 4) times each, then once
# each on one core; MB/s and CPU seconds a GB per run, and the kernel's
# huge-page counters before and after. Run from the repository root with
# .carry/tokenizer/ made by tokenizer-carry-prep.sh and the other build's
# test binary gzipped beside it:
#
#     B=tokenizer-37fa062.test bash docs/benchmarks/tokenizer-batch-ab-run.sh
#
# Output in $OUT/tokenizer-batch-ab.txt: "rROUND a|b BENCHMARK MB/s CPU-s/GB",
# a = this build.
set -uo pipefail
C=$PWD/${CARRY:-.carry/tokenizer}
OUT=${OUT:-/tmp/tokenizer-out}
mkdir -p "$OUT"
W=$(mktemp -d -p /dev/shm)
trap 'rm -rf "$W"' EXIT
gzip -dc "$C/tokenizer.test.gz" > "$W/a" && gzip -dc "$C/${B:?name the other test binary}.gz" > "$W/b" && chmod +x "$W/a" "$W/b"
gzip -dc "$C/go20.txt.gz" > "$W/go20.txt"
cd tokenizer # the benchmarks read their vocabularies from testdata/
bench() { # BUILD CORES TIMES LABEL
	KILN_TOKENIZER_BENCH_TEXT="$W/go20.txt" "$W/$1" -test.run '^$' -test.bench EncodeBatch -test.benchtime "$3x" -test.cpu "$2" 2>&1 |
		awk -v b="$1" -v l="$4" '/^Benchmark/ {print l, b, $1, $5, $7}'
}
{
	echo "host $(uname -n), $(nproc) cores, $(date -u +%FT%TZ); a = this build, b = $B"
	echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
	grep -E '^(thp_fault_alloc|thp_fault_fallback|compact_stall) ' /proc/vmstat
	for round in $(seq 1 "${ROUNDS:-4}"); do
		for build in a b; do bench $build "$(nproc)" 10 "r$round"; done
	done
	for build in a b; do bench $build 1 5 one; done
	grep -E '^(thp_fault_alloc|thp_fault_fallback|compact_stall) ' /proc/vmstat
} | tee "$OUT/tokenizer-batch-ab.txt"
