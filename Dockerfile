# The kvscope image: the sidecar and the node agent (`kvscope run`), and with KVSCOPE_EXTRAS=reference,web
# the reference engine and load generator the compose demo runs. Runs as a non-root user and writes nothing
# to its root file system (run it with a read-only root; give the JSON Lines exporter, if enabled, a volume).
# Reproducible: the base is an exact release, every dependency is pinned (deploy/docker/constraints.txt),
# nothing is fetched at run time, and SOURCE_DATE_EPOCH fixes the wheel's timestamps. docs/deploy.md says
# how to build and tag it.
FROM python:3.11.14-slim-bookworm AS wheel
ARG SOURCE_DATE_EPOCH=0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY package package
COPY agent agent
COPY collectors collectors
COPY exporters exporters
COPY dashboards dashboards
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11.14-slim-bookworm
# web: TLS/basic-auth config; node: the kubelet's pod-resources client (the node agent); reference: the demo
ARG KVSCOPE_EXTRAS=web
ARG SOURCE_DATE_EPOCH=0
COPY --from=wheel /wheels /wheels
COPY deploy/docker/constraints.txt /constraints.txt
# /data: where the demo's reference engine keeps G3/G4; a new volume mounted there takes its owner
RUN PIP_CONSTRAINT=/constraints.txt pip install --no-cache-dir "$(ls /wheels/kvscope-*.whl)[${KVSCOPE_EXTRAS}]" \
 && rm -rf /wheels /constraints.txt \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent kvscope \
 && mkdir /data && chown 10001:10001 /data
# no .pyc files, matplotlib's cache in the tmpfs, unbuffered logs
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
EXPOSE 9474 9475 4318
ENTRYPOINT ["kvscope"]
CMD ["run"]
