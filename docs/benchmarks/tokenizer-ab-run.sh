#!/usr/bin/env bash
# Two builds of `sched tokenize` alternated on the same text, on one core and
# on all, for both golden vocabularies: wall seconds, user and system CPU
# seconds and peak RSS of each run, and whether both builds wrote the same
# ids. Run from the repository root with .carry/tokenizer/ made by
# tokenizer-carry-prep.sh, and the other build gzipped beside it:
#
#     B=sched-d2dd207 bash docs/benchmarks/tokenizer-ab-run.sh
#
# BYTES (default 512 MB) of the device run's mixed text, in /dev/shm;
# ROUNDS (default 2) alternations. Output in $OUT/tokenizer-ab.txt.
set -uo pipefail
C=${CARRY:-.carry/tokenizer}
OUT=${OUT:-/tmp/tokenizer-out}
mkdir -p "$OUT"
W=$(mktemp -d -p /dev/shm)
trap 'rm -rf "$W"' EXIT
res=$OUT/tokenizer-ab.txt
gzip -dc "$C/sched.gz" > "$W/a" && gzip -dc "$C/${B:?name the other build}.gz" > "$W/b" && chmod +x "$W/a" "$W/b"
gzip -dc "$C/go20.txt.gz" > "$W/go20.txt"
gzip -dc "$C/prose.txt.gz" > "$W/prose.txt"
. "$(dirname "$0")/tokenizer-corpus.sh"
mixed_corpus "$W/go20.txt" "$W/prose.txt" "${BYTES:-512000000}" > "$W/corpus.txt"
echo "host $(uname -n), $(nproc) cores, corpus $(stat -c %s "$W/corpus.txt") bytes, $(date -u +%FT%TZ); a = this build, b = $B" | tee "$res"
run() { # BUILD STYLE CORES
	local pin=() out="$W/ids-$1-$2-$3"
	[ "$3" = 1 ] && pin=(taskset -c 0)
	rm -f "$out" # sched tokenize replaces no file without --force, which older builds lack
	GOMAXPROCS=$3 python3 - "${pin[@]}" "$W/$1" tokenize --tokenizer-file "$C/$2-style.tokenizer.json" --in "$W/corpus.txt" --out "$out" --dtype u16 <<'PY'
import resource, subprocess, sys, time
t = time.time()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
wall = time.time() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{wall:.3f} s wall, {r.ru_utime:.2f} user, {r.ru_stime:.2f} sys, {r.ru_maxrss // 1024} MiB, rc {rc}")
PY
}
for round in $(seq 1 "${ROUNDS:-2}"); do
	for style in gpt2 gpt4; do
		for cores in 1 "$(nproc)"; do
			for build in a b; do
				echo "round $round $style cores $cores build $build: $(run $build $style $cores)"
			done
			if cmp -s "$W/ids-a-$style-$cores" "$W/ids-b-$style-$cores"; then echo "  same ids"; else echo "  IDS DIFFER"; fi
			rm -f "$W"/ids-*
		done
	done
done | tee -a "$res"
