# syntax=docker/dockerfile:1.7
# rlsched scheduler extender image. Build from the repository root:
#   docker build -f deploy/docker/scheduler.Dockerfile -t rlsched-scheduler:dev .
# Multi-stage: dependencies and the package are installed into a virtualenv in the
# build stage; the final stage copies only that virtualenv and runs as a non-root user.
# No torch: the package is installed with --no-deps on top of requirements-serve.txt and
# learned policies are served with numpy. No dev tooling: dev/ (the rlsched-dev
# distribution: local control plane, demo, fake trainer) is neither copied nor installed.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/rlsched
COPY deploy/docker/requirements-serve.txt /tmp/requirements-serve.txt
RUN /opt/rlsched/bin/pip install -r /tmp/requirements-serve.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rlsched/ rlsched/
COPY core/ core/
COPY sim/ sim/
COPY extender/ extender/
COPY operator/ operator/
COPY models/ models/
RUN /opt/rlsched/bin/pip install --no-deps . \
 && /opt/rlsched/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)" \
 && /opt/rlsched/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('rlsched_dev') is not None)" \
 && /opt/rlsched/bin/rlsched --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="rlsched scheduler extender" \
      org.opencontainers.image.description="kube-scheduler extender with DAS topology-aware placement (runs beside kube-scheduler)" \
      org.opencontainers.image.source="https://github.com/rlsched/rlsched" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/rlsched /opt/rlsched
ENV PATH=/opt/rlsched/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
# Numeric user so that runAsNonRoot can verify it; the chart mounts /tmp as the only
# writable path (readOnlyRootFilesystem).
USER 65532:65532
EXPOSE 8889
ENTRYPOINT ["rlsched"]
CMD ["extender", "serve", "--host", "127.0.0.1", "--port", "8888"]
