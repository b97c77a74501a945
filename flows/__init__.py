"""Prefect flows, tasks and the ``gnnpipe`` CLI."""
