#!/usr/bin/env bash
# Builds .carry/g/ for the GPU scripts (multi-gpu-run.sh, gpu-worker-run.sh,
# hang-run.sh, gpu-checks-run.sh), on a machine with the Go toolchain, from
# the repository root:
#
#     bash docs/benchmarks/gpu-carry-prep.sh [PEER]
#
# PEER is the PyTorch peer (default ../shared/bench/torch_peer.py; copied
# when it exists). Carry the folder .carry/g (CARRY overrides it); the
# script prints its size, which must stay under the 64 MiB a call carries.
# It then holds:
#   sched.gz                     `sched`, CGO_ENABLED=0, stripped, gzipped
#   kernels.test.gz, trainer.test.gz, cuda.test.gz, sched.test.gz
#                                the tests of ./kernels/, ./trainer/,
#                                ./kernels/cuda/ and ./cmd/sched/, same build
#   store.tgz                    `sched demo`'s token store and tokenizer
#                                (tokens/go-stdlib, tokenizer.json): the
#                                SIGTERM runs of multi-gpu-run.sh
#   demo.tgz                     the same demo's tokens/, tokenizers/ and
#                                objects/tokenizers/: gpu-worker-run.sh
#   redis/                       redis-server and the libraries it links,
#                                for hosts without one: mkdir -p /tmp/r &&
#                                cp .carry/g/redis/* /tmp/r && export
#                                PATH=/tmp/r:$PATH LD_LIBRARY_PATH=/tmp/r
#   torch_peer.py                the PyTorch peer, when PEER exists
set -euo pipefail
peer=${1:-../shared/bench/torch_peer.py}
G=${CARRY:-.carry/g}
rm -rf "$G"; mkdir -p "$G/redis"
export CGO_ENABLED=0
go build -ldflags="-s -w" -o "$G/sched" ./cmd/sched
for p in kernels trainer kernels/cuda cmd/sched; do
  go test -ldflags="-s -w" -c -o "$G/$(basename $p).test" ./$p/
done
gzip "$G"/sched "$G"/*.test

# The demo's stores: a few seconds of training, the tokenizer and the
# store are what the runs read.
D=$(mktemp -d)
go run ./cmd/sched demo --duration 5s --dir "$D" > "$D.log" 2>&1 || { cat "$D.log"; exit 1; }
tar czf "$G/store.tgz" -C "$D" tokens/go-stdlib tokenizer.json
tar czf "$G/demo.tgz" -C "$D" tokens tokenizers objects/tokenizers
rm -rf "$D" "$D.log"

redis=$(command -v redis-server)
cp "$redis" "$G/redis/"
# Not the C library's own (libc, libm, ...): one of another glibc than the
# host's loader fails to load.
ldd "$redis" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$G/redis/"; done

if [ -f "$peer" ]; then cp "$peer" "$G/"; else echo "no PyTorch peer at $peer: the DDP comparison is left out"; fi
du -sh "$G"; ls -l "$G" "$G/redis"
