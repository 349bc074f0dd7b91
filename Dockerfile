# No Docker engine is available in this workplace: this file is reviewed, not built, here.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/paymentsd ./cmd/paymentsd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/paymentsd /paymentsd
# nonroot:nonroot, written numerically so the kubelet can verify runAsNonRoot.
USER 65532:65532
# 9090 gRPC, 8080 HTTP (REST, /healthz, /readyz, /metrics, /openapi.json),
# 8081 the webhook intake (with PAYMENTS_WEBHOOK_ADDR=:8081, as deploy/ sets),
# 8082 /metrics alone (with PAYMENTS_METRICS_ADDR=:8082, as deploy/ sets)
EXPOSE 9090 8080 8081 8082
ENTRYPOINT ["/paymentsd"]
