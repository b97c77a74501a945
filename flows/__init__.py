"""Prefect flows, tasks and the ``gnnpipe`` CLI.

- The flow: ``pipeline`` (download → partition → features → hotness → train → infer, each a cached task up to
  ``until``), ``tasks`` (one Prefect task per stage; the cache key is the artifact's key), ``direct`` (the same
  stages in this process, without Prefect, for tests and benchmarks), ``builds`` (which stages a config would take
  from the cache: ``cached``, ``stale`` or ``missing``).
- Configuration: ``config`` (the pipeline's config, derived from the stages' ``Params``), ``load`` (defaults ←
  ``--config FILE`` ← ``--set``), ``params_doc`` (the parameter table of ``gnnpipe params`` and the README).
- The CLI: ``cli`` (``gnnpipe``: run the pipeline or a stage, inspect the store), ``cli_train`` (this node's share of
  the train stage, multi-node), ``cli_store`` (``status``/``show``/``clean``), ``cli_export`` (``export infer``),
  ``cli_score`` (``score``: pairs scored by a link model), ``cli_verify`` (``verify``: builds against their
  checksums), ``cli_ops`` (``server``/``worker``/``deploy``), ``terminal`` (the CLI's last line on a line of its
  own), ``quiet`` (one line for a user's error, Prefect's repeats kept off the terminal).
- Prefect around a run: ``env`` (settings needed before ``prefect`` is imported), ``api`` (which Prefect API a run
  talks to; the temporary server), ``services`` (a Prefect server and a process worker for deployments),
  ``records`` (where an artifact root's Prefect records live), ``locks`` (stage locks that die with their holder),
  ``holders`` (who holds a lock or a flow run, and whether it lives), ``crashed`` (runs whose process was killed are
  marked Crashed by the next run), ``interrupts`` (SIGINT and SIGTERM end a run the same way).
"""
