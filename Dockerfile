# The kvscope image: the sidecar (`kvscope run`), and with KVSCOPE_EXTRAS=reference,web the reference
# engine and load generator the compose demo runs. Runs as a non-root user and writes nothing to its
# root file system (run it with a read-only root; give the JSON Lines exporter, if enabled, a volume).
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY package package
COPY agent agent
COPY collectors collectors
COPY exporters exporters
COPY dashboards dashboards
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ARG KVSCOPE_EXTRAS=web
COPY --from=wheel /wheels /wheels
# /data: where the demo's reference engine keeps G3/G4; a new volume mounted there takes its owner
RUN pip install --no-cache-dir "$(ls /wheels/kvscope-*.whl)[${KVSCOPE_EXTRAS}]" && rm -rf /wheels \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent kvscope \
 && mkdir /data && chown 10001:10001 /data
# no .pyc files, matplotlib's cache in the tmpfs, unbuffered logs
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
EXPOSE 9474 4318
ENTRYPOINT ["kvscope"]
CMD ["run"]
