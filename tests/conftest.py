"""Shared fixtures: a real Kafka-protocol broker, the shared datasets, seeds."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


def _docker_engine_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """bootstrap_servers of a real broker for the whole session.

    testcontainers' Kafka where a Docker engine runs; otherwise the embedded Tansu
    broker (the same one `monitor demo` uses) on 127.0.0.1.
    """
    if _docker_engine_available() and not os.environ.get("MONITOR_TEST_FORCE_TANSU"):
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from monitor.pipeline.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def fresh_broker():
    """A broker of one's own, for tests that kill or restart it."""
    from monitor.pipeline.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS


# Test files whose tests run several real processes against real time (SIGKILLs, several
# stage-1 instances, broker restarts, the demo). With the suite on several workers they share one
# worker, one file after another: two of them at once (4 workers) starved a 2-core machine until
# windows were released half a minute late and a SIGTERM could not finish in time.
PROCESS_HEAVY = {"test_crash.py", "test_instances.py", "test_join_crash.py", "test_broker_restart.py", "test_fuzz.py",
                 "test_window_contents.py", "test_demo.py", "test_budget_durability.py", "test_readme_steps.py", "test_run_over_restart.py",
                 "test_service.py"}


@pytest.fixture(scope="session")
def vitals_model():
    """A GridKNN fitted on 3,000 simulated vital-sign rows (seeded): the model the releaser
    tests share."""
    from monitor.data.vitals import VITAL_FEATURES, simulate_vitals
    from monitor.model import GridKNN

    _, X, _ = simulate_vitals(3000, rng=5)
    return GridKNN(epsilon=1.0, bounds=[(lo, hi) for _, lo, hi in VITAL_FEATURES], contamination=0.05, random_state=0,
                   feature_names=[n for n, _, _ in VITAL_FEATURES]).fit(X)


# First: xdist's worker turns the xdist_group marks into its groups in a hook of its own, registered
# after this conftest and so run before it, unless this one goes first. Without tryfirst no test was
# grouped: a module's fixtures started once on each worker (Prometheus's stack twice, 40 s each) and
# the PROCESS_HEAVY files ran side by side.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """xdist groups (``--dist loadgroup``): one group per test file, as ``loadfile`` would
    (a file's module fixtures start once), except that the PROCESS_HEAVY files form one."""
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("process-heavy" if name in PROCESS_HEAVY else name))
