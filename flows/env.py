"""Prefect settings that must be in place before ``prefect`` is imported (the Makefile sets them too)."""

import os


def configure_prefect_env() -> None:
    # A repo-local home keeps runs, logs and the SQLite database out of ~/.prefect; no telemetry leaves the box.
    os.environ.setdefault("PREFECT_HOME", os.path.abspath(".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
