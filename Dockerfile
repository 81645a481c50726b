# The outbox-relay image: a static binary on distroless, run as a non-root user.
#   docker build --build-arg VERSION="$(git describe --always --dirty)" -t outbox-relay .
FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first: this layer stays cached while only the code changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /out/outbox-relay ./cmd/outbox-relay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outbox-relay /usr/local/bin/outbox-relay
USER nonroot:nonroot
# /metrics, /healthz, /readyz. The relay listens on 127.0.0.1:9187 unless told
# otherwise: set RELAY_METRICS_LISTEN=0.0.0.0:9187 to reach them from outside the
# container (they carry no secrets). Passwords: mount files readable by the
# nonroot user (uid 65532) and point postgres.password_file /
# kafka.sasl.password_file (RELAY_POSTGRES_PASSWORD_FILE, ...) at them.
EXPOSE 9187
ENTRYPOINT ["/usr/local/bin/outbox-relay"]
CMD ["run"]
