#!/usr/bin/env bash
# Builds .carry/g/ for one of the GPU scripts, on a machine with the Go
# toolchain, from the repository root:
#
#     FOR=multi|worker|x2|hang bash docs/benchmarks/gpu-carry-prep.sh [PEER]
#
# A call carries the working tree (about 24 MB tracked, the golden tensors
# most of it) and the carried folder together, at most 64 MiB: everything
# the scripts read (78 MB with the tree) does not fit one call, so each
# build holds what one script reads:
#   FOR=multi (default)   multi-gpu-run.sh: sched.gz, kernels.test.gz,
#                         trainer.test.gz, cuda.test.gz, store.tgz,
#                         torch_peer.py (about 24 MB)
#   FOR=worker            gpu-worker-run.sh: sched.gz, demo.tgz, redis/
#                         (about 29 MB)
#   FOR=x2                both of the above in one call, for a host lent
#                         for a few minutes: multi-gpu-run.sh, then
#                         gpu-worker-run.sh (about 41 MB, 64 with the tree)
#   FOR=hang              hang-run.sh and gpu-checks-run.sh: sched.gz and the
#                         tests of ./kernels/, ./trainer/, ./kernels/cuda/ and
#                         ./cmd/sched/ (about 36 MB)
# PEER is the PyTorch peer (default ../shared/bench/torch_peer.py; copied
# when it exists). CARRY overrides the folder. The files:
#   sched.gz                     `sched`, CGO_ENABLED=0, stripped, gzipped
#   *.test.gz                    the tests of the packages above, same build
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
case ${FOR:=multi} in
  multi|x2) tests="kernels trainer kernels/cuda" ;;
  worker) tests="" ;;
  hang) tests="kernels trainer kernels/cuda cmd/sched" ;;
  *) echo "FOR=$FOR: give multi, worker, x2 or hang"; exit 2 ;;
esac
rm -rf "$G"; mkdir -p "$G"
export CGO_ENABLED=0
go build -ldflags="-s -w" -o "$G/sched" ./cmd/sched
for p in $tests; do
  go test -ldflags="-s -w" -c -o "$G/$(basename $p).test" ./$p/
done
gzip "$G"/sched
if [ -n "$tests" ]; then gzip "$G"/*.test; fi

if [ "$FOR" != hang ]; then
  # The demo's stores: a few seconds of training, the tokenizer and the
  # store are what the runs read.
  D=$(mktemp -d)
  go run ./cmd/sched demo --duration 5s --dir "$D" > "$D.log" 2>&1 || { cat "$D.log"; exit 1; }
  if [ "$FOR" != worker ]; then tar czf "$G/store.tgz" -C "$D" tokens/go-stdlib tokenizer.json; fi
  if [ "$FOR" != multi ]; then tar czf "$G/demo.tgz" -C "$D" tokens tokenizers objects/tokenizers; fi
  rm -rf "$D" "$D.log"
fi

if [ "$FOR" = worker ] || [ "$FOR" = x2 ]; then
  mkdir -p "$G/redis"
  redis=$(command -v redis-server)
  cp "$redis" "$G/redis/"
  # Not the C library's own (libc, libm, ...): one of another glibc than the
  # host's loader fails to load.
  ldd "$redis" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$G/redis/"; done
fi

if [ "$FOR" = multi ] || [ "$FOR" = x2 ]; then
  if [ -f "$peer" ]; then cp "$peer" "$G/"; else echo "no PyTorch peer at $peer: the DDP comparison is left out"; fi
fi
ls -lR "$G"
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
carry=$(du -sb "$G" | cut -f1)
echo "FOR=$FOR: $carry bytes in $G, $tree in the tracked tree, $((tree + carry)) together of the 67108864 a call carries"
if [ $((tree + carry)) -gt 67108864 ]; then echo "too large to carry"; exit 1; fi
