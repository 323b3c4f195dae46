# One static-ish binary (CGO_ENABLED=0), two runtime images:
#   cpu: a glibc base, because purego dlopens libraries through glibc's loader
#   gpu: a CUDA runtime image that carries libcublasLt and libnvrtc
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sched ./cmd/sched

FROM debian:bookworm-slim AS cpu
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/sched /usr/local/bin/sched
VOLUME /data
ENV KILN_DATA_DIR=/data
ENTRYPOINT ["/usr/local/bin/sched"]
CMD ["worker", "--queues", "ingest=4"]

FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04 AS gpu
COPY --from=build /out/sched /usr/local/bin/sched
VOLUME /data
ENV KILN_DATA_DIR=/data
ENTRYPOINT ["/usr/local/bin/sched"]
CMD ["worker", "--queues", "gpu=1,append=2"]
