# Runnel in a container: built from this checkout, run as a non-root user, data in a volume.
#   docker build -t runnel .
#   docker run -p 4437:4437 -v runnel-data:/data runnel
# Settings are the RUNNEL_* environment variables (see the README); pass secrets such as
# RUNNEL_AUTH_TOKEN with `--env-file`, not on the command line.

FROM rust:1.91-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin runnel \
    && cp target/release/runnel /usr/local/bin/runnel

FROM debian:bookworm-slim
# ca-certificates: a mirror trusts an https upstream by the system's roots. curl: the healthcheck.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates=20230311* curl=7.88.* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin runnel \
    && mkdir -p /data \
    && chown runnel:runnel /data
COPY --from=build /usr/local/bin/runnel /usr/local/bin/runnel
USER 10001:10001
ENV RUNNEL_LISTEN=0.0.0.0:4437 \
    RUNNEL_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 4437
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
    CMD ["curl", "-fsS", "http://127.0.0.1:4437/readyz"]
# SIGTERM drains (see --shutdown-timeout-secs); give it longer than that with `docker stop -t`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/runnel"]
CMD ["serve"]
