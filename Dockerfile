# syntax=docker/dockerfile:1
#
# faultrouter: a static binary on distroless, running as a non-root user.
# The topic specs (topics/) and Avro schemas (avro/) are embedded in the
# binary, so the image holds nothing else.
#
#   docker build -t faultrouter .
#   docker run --rm faultrouter demo

FROM golang:1.26 AS build
WORKDIR /src
# Module downloads first, so that a source change reuses the cached layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" \
        -o /out/faultrouter ./cmd/faultrouter
# The state directory, created here because the final image has no shell. A
# fresh named volume mounted on it inherits its owner, the non-root user.
RUN mkdir -p /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/faultrouter /faultrouter
COPY --from=build --chown=65532:65532 /out/state /var/lib/faultrouter
# 65532 is distroless's "nonroot" user; numeric so that Kubernetes'
# runAsNonRoot can verify it.
USER 65532:65532
# Prometheus metrics (run --metrics-addr :9464).
EXPOSE 9464
ENTRYPOINT ["/faultrouter"]
