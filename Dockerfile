# syntax=docker/dockerfile:1
# idempay API image: static Go binary on distroless (no shell, runs as nonroot).
# Used by compose.yaml; `docker build -t idempay .` also works on its own.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY client/go.mod client/
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/idempay ./cmd/idempay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/idempay /usr/local/bin/idempay
ENV LISTEN_ADDR=0.0.0.0:8080
EXPOSE 8080
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/idempay"]
CMD ["serve"]
