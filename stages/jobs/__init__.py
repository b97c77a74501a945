"""Jobs: start a distributed job's ranks from the stage's process and never leave one behind (train, infer).

Its own room, not ``runtime/``: ``runtime/`` is the rank's runtime (code that runs inside each rank: samplers, the
feature path, collectives), while this code runs in gnnpipe's own process around the ranks and imports no torch.

- ``launcher``: the job's agent in its own session with streamed logs, process-group teardown and one-line
  errors.
- ``local_agent``: the single-host agent that starts the ranks itself (torchrun stays for several hosts).
- ``errors``: ``JobError`` and ``JobKind``, the job a caller names (training, inference) and what a rerun does, so
  the errors speak of the caller's job; ``TRAINING`` and its ``TrainingError``.
- ``cluster``: this node's place in a (multi-node) job: rendezvous, node rank, usable CPUs, threads per rank.
- ``lifeline``: the supervisor that stops a job when gnnpipe's process dies, however it dies.
- ``host_memory``: the environment that puts a job's big host tensors on huge pages.
"""
