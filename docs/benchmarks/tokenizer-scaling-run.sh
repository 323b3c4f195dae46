#!/usr/bin/env bash
# Why `sched tokenize` on one large file does not scale with the cores: what
# the machine gives a compute-bound single-threaded loop, against what kiln's
# one process gets, with CPU profiles of the in-process path on one core and
# on all.
#
# Run from the repository root, with .carry/tokenizer/ made beforehand by
# docs/benchmarks/tokenizer-carry-prep.sh on a machine with Go (the host
# needs bash, python3, taskset and split, no Go):
#
#     bash docs/benchmarks/tokenizer-scaling-run.sh
#
# CARRY (default .carry/tokenizer), OUT (default /tmp/tokenizer-out) and
# CORPUS_BYTES (default 512000000) override the defaults; PARTS (default
# "ceiling kiln profiles") picks which of the parts below run, so that two
# builds can be set side by side in one call (PARTS=kiln for the second). The corpus is made
# as tokenizer-device-run.sh makes its 1 GB: the Go text and the prose in
# turns, each turn rotated by a different number of lines.
#
# What it measures (MAXN = the CPUs this process may run on, at most 16):
#   machine   lscpu and which CPUs are hardware threads of one core
#   ceiling   N = 1, 2, 4, 8, 16 (up to MAXN) independent processes at once,
#             each `GOMAXPROCS=1 taskset -c <cpu i> sched tokenize` on its own
#             sixteenth of the corpus: perfectly parallel work, each with its
#             own word caches. Also one process per physical core, every
#             second CPU, and two processes on the two threads of one core.
#   kiln      `GOMAXPROCS=P sched tokenize` on the whole corpus, P = 1 (pinned
#             to one CPU), 2, 4, 8, 16, and P = physical cores pinned one a
#             core; best of two; wall and CPU seconds (CPU seconds that grow
#             with P are work that got slower, not waiting)
#   profiles  BenchmarkTokenizeFile (the command's path in the test binary)
#             on ~200 MB: cpu1.prof and cpuN.prof (N = MAXN; cpu16.prof on
#             the 16-core host) in $OUT, then its cold/warm and piece size
#             variants on one core and on all
#   gc        GODEBUG=gctrace=1 collections of the all-core run
#
# Everything lands in $OUT/tokenizer-scaling.txt, the summary first; the
# profiles beside it (read them with `go tool pprof tokenizer.test cpuN.prof`,
# tokenizer.test from the same carry). Ids go to files (in /dev/shm where
# there is room), as a user's run writes them. About 3 minutes on 16 cores.
set -uo pipefail

C=${CARRY:-.carry/tokenizer}
OUT=${OUT:-/tmp/tokenizer-out}
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
raw=$W/raw.txt
: > "$raw"
note() { echo "$@" | tee -a "$raw" >&2; }
t0=$(date +%s)

gzip -dc "$C/sched.gz" > "$W/sched" && chmod +x "$W/sched"
gzip -dc "$C/tokenizer.test.gz" > "$W/tokenizer.test" && chmod +x "$W/tokenizer.test"
gzip -dc "$C/go20.txt.gz" > "$W/go20.txt"
gzip -dc "$C/prose.txt.gz" > "$W/prose.txt"
tj2=$C/gpt2-style.tokenizer.json
tj4=$C/gpt4-style.tokenizer.json

# The CPUs this process may use, and from their topology one CPU per
# physical core and, where a core has two threads here, one such pair.
read -r -a cpus <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
topo=$(python3 - "${cpus[@]}" <<'PY'
import sys
allowed = [int(c) for c in sys.argv[1:]]
def expand(s):
    out = []
    for part in s.strip().split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out
groups = {}
for c in allowed:
    try:
        sib = open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read()
    except OSError:
        sib = str(c)
    key = tuple(x for x in expand(sib) if x in allowed)
    groups.setdefault(key, key)
first = sorted(g[0] for g in groups.values())
pair = next((g[:2] for g in groups.values() if len(g) >= 2), ())
print(",".join(map(str, first)) + " " + (",".join(map(str, pair)) or "-"))
PY
)
percore=${topo% *}
smtpair=${topo#* }
maxn=${#cpus[@]}
((maxn > 16)) && maxn=16
ncores=$(tr ',' '\n' <<< "$percore" | wc -l)

{
	echo "== machine"
	echo "host: $(uname -n), $(date -u +%FT%TZ), nproc $(nproc), usable CPUs ${#cpus[@]} (${cpus[*]}), MAXN $maxn"
	echo "physical cores among them: $ncores (one CPU each: $percore); two threads of one core: $smtpair"
	grep MemTotal /proc/meminfo
	lscpu
	echo "thread_siblings_list, distinct:"
	cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | sort -u | tr '\n' ' '
	echo
	echo "physical_package_id, distinct: $(cat /sys/devices/system/cpu/cpu*/topology/physical_package_id 2>/dev/null | sort -u | tr '\n' ' ')"
} >> "$raw" 2>&1

# The corpus, as tokenizer-device-run.sh makes it, then in 16 pieces that
# end at line breaks.
. "$(dirname "$0")/tokenizer-corpus.sh"
mixed_corpus "$W/go20.txt" "$W/prose.txt" "${CORPUS_BYTES:-512000000}" > "$W/corpus.txt"
(cd "$W" && split -n l/16 -d corpus.txt chunk.)
head -c 200000000 "$W/corpus.txt" > "$W/corpus200.txt"
note "corpus.txt: $(stat -c %s "$W/corpus.txt") bytes, sha256 $(sha256sum "$W/corpus.txt" | cut -c1-16); chunks $(stat -c %s "$W"/chunk.* | tr '\n' ' ')"
rm -f "$W/go20.txt" "$W/prose.txt"

# Ids go to memory when there is room, else beside the corpus.
ids=$W/ids
if [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')" -gt 2000000 ] 2>/dev/null; then
	ids=$(mktemp -d /dev/shm/kiln-scaling.XXXXXX)
	trap 'rm -rf "$W" "$ids"' EXIT
fi
mkdir -p "$ids"

# batch LABEL GOMAXPROCS TOKENIZER CPUS:FILE...: runs one `sched tokenize`
# per CPUS:FILE at once (CPUS "-" for no taskset) and prints one JSON line:
# bytes in, wall seconds of the whole batch, each process's wall and CPU
# seconds, exit statuses.
cat > "$W/batch.py" <<'PY'
import json, os, subprocess, sys, time
label, procs, tj, sched, ids = sys.argv[1:6]
jobs = [a.split(":", 1) for a in sys.argv[6:]]
env = dict(os.environ, GOMAXPROCS=procs)
size = sum(os.path.getsize(f) for _, f in jobs)
for i in range(len(jobs)):  # sched tokenize replaces no file without --force
    if os.path.exists(f"{ids}/ids.{i}"):
        os.remove(f"{ids}/ids.{i}")
start, run = time.perf_counter(), {}
for i, (cpu, f) in enumerate(jobs):
    cmd = [sched, "tokenize", "--tokenizer-file", tj, "--in", f, "--out", f"{ids}/ids.{i}", "--dtype", "u16"]
    if cpu != "-":
        cmd = ["taskset", "-c", cpu] + cmd
    err = open(f"{ids}/err.{i}", "w+")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    run[p.pid] = (i, time.perf_counter(), err)
walls, cpu_s, rcs, errs = [0.0] * len(jobs), [0.0] * len(jobs), [0] * len(jobs), []
while run:
    pid, status, ru = os.wait4(-1, 0)
    if pid not in run:
        continue
    i, t, err = run.pop(pid)
    walls[i] = time.perf_counter() - t
    cpu_s[i] = ru.ru_utime + ru.ru_stime
    rcs[i] = os.waitstatus_to_exitcode(status)
    if rcs[i]:
        err.seek(0)
        errs.append(err.read()[-300:])
wall = time.perf_counter() - start
for i in range(len(jobs)):
    for f in (f"{ids}/ids.{i}", f"{ids}/err.{i}"):
        try:
            os.remove(f)
        except OSError:
            pass
print(json.dumps(dict(batch=label, procs=len(jobs), gomaxprocs=int(procs), bytes=size, wall=round(wall, 3),
                      walls=[round(w, 3) for w in walls], cpu=[round(c, 3) for c in cpu_s], rc=rcs, errors=errs)))
PY
batch() { timeout 200 python3 "$W/batch.py" "$1" "$2" "$3" "$W/sched" "$ids" "${@:4}" | tee -a "$raw"; }

# cpu_list I...: the usable CPUs at those indices, comma-separated.
cpu_at() { local out=() i; for i in "$@"; do out+=("${cpus[$i]}"); done; local IFS=,; echo "${out[*]}"; }

# The ceiling: independent single-threaded processes, each pinned to one
# CPU and given its own piece of the corpus.
has() { case " ${PARTS:-ceiling kiln profiles} " in *" $1 "*) return 0 ;; esac; return 1; }

has ceiling && {
note "== ceiling: N independent GOMAXPROCS=1 processes, one pinned per CPU, gpt2"
for rep in 1 2; do
	for n in 1 2 4 8 16; do
		((n > maxn)) && continue
		args=()
		for ((i = 0; i < n; i++)); do args+=("${cpus[$i]}:$W/chunk.$(printf %02d "$i")"); done
		batch "ceiling-$n" 1 "$tj2" "${args[@]}"
	done
	# Every second CPU (for when the two threads of a core are adjacent).
	args=()
	for ((i = 0; i < maxn / 2 && 2 * i < ${#cpus[@]}; i++)); do args+=("${cpus[$((2 * i))]}:$W/chunk.$(printf %02d "$i")"); done
	batch "ceiling-even-$((maxn / 2))" 1 "$tj2" "${args[@]}"
	# One a physical core, and two on the threads of one core.
	args=()
	i=0
	for c in ${percore//,/ }; do
		((i < 16)) && args+=("$c:$W/chunk.$(printf %02d "$i")")
		i=$((i + 1))
	done
	batch "ceiling-percore-${#args[@]}" 1 "$tj2" "${args[@]}"
	if [ "$smtpair" != - ]; then
		batch "ceiling-smtpair-2" 1 "$tj2" "${smtpair%,*}:$W/chunk.00" "${smtpair#*,}:$W/chunk.01"
		pc=(${percore//,/ })
		if ((${#pc[@]} >= 2)); then
			batch "ceiling-twocores-2" 1 "$tj2" "${pc[0]}:$W/chunk.00" "${pc[1]}:$W/chunk.01"
		fi
	fi
done
note "elapsed $(($(date +%s) - t0)) s"
}

# kiln's one process on the whole corpus.
has kiln && {
note "== kiln: one sched tokenize on the corpus, GOMAXPROCS=P"
for rep in 1 2; do
	batch "kiln-gpt2-1" 1 "$tj2" "${cpus[0]}:$W/corpus.txt"
	for p in 2 4 8 16; do
		((p > maxn)) && continue
		batch "kiln-gpt2-$p" "$p" "$tj2" "-:$W/corpus.txt"
	done
	if ((ncores < ${#cpus[@]})); then
		batch "kiln-gpt2-percore-$ncores" "$ncores" "$tj2" "$percore:$W/corpus.txt"
	fi
	batch "kiln-gpt4-1" 1 "$tj4" "${cpus[0]}:$W/corpus.txt"
	batch "kiln-gpt4-$maxn" "$maxn" "$tj4" "-:$W/corpus.txt"
done
note "elapsed $(($(date +%s) - t0)) s"

# GC in the all-core run.
gcs=$(GODEBUG=gctrace=1 GOMAXPROCS=$maxn timeout 100 "$W/sched" tokenize --tokenizer-file "$tj2" --in "$W/corpus.txt" --out "$ids/gc.ids" --dtype u16 2>&1 | grep -c '^gc ')
rm -f "$ids/gc.ids"
note "gctrace: sched tokenize, gpt2, GOMAXPROCS=$maxn: $gcs collections"
}

# The command's path in the test binary, profiled on one core and on all,
# then its variants.
# GOGC=400: the command's own setting.
bench() {
	(cd tokenizer && GOGC=400 KILN_TOKENIZER_BENCH_TEXT="$W/corpus200.txt" timeout 200 "$W/tokenizer.test" -test.run '^$' "$@" 2>&1) |
		grep -E '^Benchmark|FAIL|panic' | sed 's/^/bench: /' | tee -a "$raw"
}
has profiles && {
note "== profiles: BenchmarkTokenizeFile/gpt2-style/cold on $(stat -c %s "$W/corpus200.txt") bytes"
bench -test.bench 'TokenizeFile/gpt2-style/cold$' -test.benchtime 1x -test.cpu 1 -test.cpuprofile "$OUT/cpu1.prof"
bench -test.bench 'TokenizeFile/gpt2-style/cold$' -test.benchtime 3x -test.cpu "$maxn" -test.cpuprofile "$OUT/cpu$maxn.prof"
gcb=$(cd tokenizer && GOGC=400 GODEBUG=gctrace=1 KILN_TOKENIZER_BENCH_TEXT="$W/corpus200.txt" timeout 100 "$W/tokenizer.test" -test.run '^$' \
	-test.bench 'TokenizeFile/gpt2-style/cold$' -test.benchtime 3x -test.cpu "$maxn" 2>&1 | grep -c '^gc ')
note "gctrace: BenchmarkTokenizeFile/gpt2-style/cold, 3 passes, -test.cpu $maxn: $gcb collections"
note "elapsed $(($(date +%s) - t0)) s"
note "== variants: cold / warm caches, piece size"
bench -test.bench 'TokenizeFile/gpt2-style/warm$' -test.benchtime 1x -test.cpu 1
bench -test.bench 'TokenizeFile/gpt2-style/(warm|chunk)' -test.benchtime 3x -test.cpu "$maxn"
bench -test.bench 'TokenizeFile/gpt4-style/(cold|warm)$' -test.benchtime 3x -test.cpu "$maxn"
note "elapsed $(($(date +%s) - t0)) s"
}

python3 - "$raw" "$maxn" > "$OUT/tokenizer-scaling.txt" <<'PY'
import json, re, sys
raw, maxn = sys.argv[1], int(sys.argv[2])
lines = open(raw).read().splitlines()
best, bench = {}, {}
for l in lines:
    if l.startswith('{"batch"'):
        d = json.loads(l)
        if all(r == 0 for r in d["rc"]) and (d["batch"] not in best or d["wall"] < best[d["batch"]]["wall"]):
            best[d["batch"]] = d
    m = re.match(r"bench: BenchmarkTokenizeFile/(\S+?)(?:-(\d+))?\s.*\s([\d.]+) MB/s", l)
    if m:
        bench[(m.group(1), int(m.group(2) or 1))] = float(m.group(3))
mbs = lambda d: d["bytes"] / 1e6 / d["wall"]
print(f"Tokenizer scaling, MB/s of text, best of two runs (MAXN = {maxn}).\n")
print("Ceiling: N independent `GOMAXPROCS=1 taskset -c <cpu> sched tokenize` at once, each on its own 1/16 of the corpus.")
print("speed-up = aggregate / aggregate of N=1; CPU s/GB = CPU seconds per GB of text (grows when each thread gets slower).\n")
print("| run | N | aggregate MB/s | per process MB/s | speed-up | CPU s/GB |")
print("|---|---|---|---|---|---|")
one = best.get("ceiling-1")
for k, d in best.items():
    if not k.startswith("ceiling-"):
        continue
    per = sum(d["bytes"] / d["procs"] / 1e6 / w for w in d["walls"]) / d["procs"]
    sp = f"{mbs(d) / mbs(one):.2f}x" if one else "-"
    print(f"| {k} | {d['procs']} | {mbs(d):.1f} | {per:.1f} | {sp} | {sum(d['cpu']) / d['bytes'] * 1e9:.2f} |")
print("\nkiln: one `GOMAXPROCS=P sched tokenize` on the whole corpus (P=1 pinned to one CPU; percore: pinned one a physical core).\n")
print("| run | P | MB/s | speed-up | CPU s/GB | ceiling speed-up at N=P |")
print("|---|---|---|---|---|---|")
for style in ("gpt2", "gpt4"):
    one = best.get(f"kiln-{style}-1")
    for k, d in best.items():
        if not k.startswith(f"kiln-{style}-"):
            continue
        p = d["gomaxprocs"]
        sp = f"{mbs(d) / mbs(one):.2f}x" if one else "-"
        c1, cp = best.get("ceiling-1"), best.get(f"ceiling-{p}")
        cs = f"{mbs(cp) / mbs(c1):.2f}x" if c1 and cp and "percore" not in k else "-"
        print(f"| {k} | {p} | {mbs(d):.1f} | {sp} | {sum(d['cpu']) / d['bytes'] * 1e9:.2f} | {cs} |")
print("\nBenchmarkTokenizeFile (test binary, ~200 MB; cold = fresh tokenizer per pass as the command, warm = caches filled), MB/s:\n")
print("| variant | 1 core | MAXN cores | speed-up |")
print("|---|---|---|---|")
for v in sorted({k[0] for k in bench}):
    a, b = bench.get((v, 1)), bench.get((v, maxn))
    print(f"| {v} | {a or '-'} | {b or '-'} | {f'{b / a:.2f}x' if a and b else '-'} |")
print("\nraw figures:\n")
print("\n".join(lines))
PY
cat "$OUT/tokenizer-scaling.txt"
ls -la "$OUT" >&2
