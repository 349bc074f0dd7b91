# No Docker engine is available in this workplace: this file is reviewed, not
# built, here; cmd/paymentsd's TestDockerfile checks it, and TestBuildVersion
# builds with its -ldflags.
#
# Build with the version and revision, which the binary can't learn itself
# (.dockerignore leaves .git out of the context):
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t paymentsd .
#
# Base images are pinned by digest (the tag says what it is, the digest which
# one); bump both together, in a reviewed commit.
FROM golang:1.26@sha256:595c7847cff97c9a9e76f015083c481d26078f961c9c8dca3923132f51fe12f1 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION
ARG REVISION
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w -X main.buildVersion=${VERSION} -X main.buildRevision=${REVISION}" -o /out/paymentsd ./cmd/paymentsd

FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title=paymentsd \
      org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.revision=${REVISION}
COPY --from=build /out/paymentsd /paymentsd
# nonroot:nonroot, written numerically so the kubelet can verify runAsNonRoot.
USER 65532:65532
# 9090 gRPC, 8080 HTTP (REST, /healthz, /readyz, /metrics, /openapi.json),
# 8081 the webhook intake (with PAYMENTS_WEBHOOK_ADDR=:8081, as deploy/ sets),
# 8082 /metrics alone (with PAYMENTS_METRICS_ADDR=:8082, as deploy/ sets)
EXPOSE 9090 8080 8081 8082
ENTRYPOINT ["/paymentsd"]
