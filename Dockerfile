# syntax=docker/dockerfile:1
# Multi-stage build of pgrelay's two services: static binaries (CGO_ENABLED=0)
# on distroless/static, running as a non-root user.
#
#   docker build --target relay    -t pgrelay-relay .
#   docker build --target consumer -t pgrelay-consumer .

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
# grpcnotrace: no golang.org/x/net/trace (as `make size-check` builds them).
RUN go build -trimpath -tags grpcnotrace -ldflags="-s -w" -o /out/ ./cmd/relay ./cmd/consumer

FROM gcr.io/distroless/static-debian12:nonroot AS relay
COPY --from=build /out/relay /usr/local/bin/relay
USER nonroot:nonroot
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/relay"]
CMD ["run"]

FROM gcr.io/distroless/static-debian12:nonroot AS consumer
COPY --from=build /out/consumer /usr/local/bin/consumer
USER nonroot:nonroot
EXPOSE 9091
ENTRYPOINT ["/usr/local/bin/consumer"]
CMD ["run"]
