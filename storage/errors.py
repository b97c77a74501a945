"""User-facing errors. Each carries one line that says what went wrong and what to do about it.

Which layer raises what:

- ``InputError`` where user input enters: the stages' Params (a ``stages.params.ParamsError``; a library validator
  they call, such as ``stages.runtime.sampling.fanouts``, raises ValueError, which the Params turn into the user's
  error) and each ``stage.run``'s checks of them against its upstream, input files
  (``stages.download``), the CLI and config, and the train worker's checks of its spec against the artifacts and
  the cluster. The check runs there, before any library call needs it.
- ``ArtifactError`` where a stored artifact is read and found missing, incomplete or corrupted.
- Library code (``stages.runtime``, the partition compute in ``stages.partition``) assumes checked input and
  raises plain ``ValueError`` / ``IndexError`` for a broken invariant: a caller's bug, shown with its traceback.
  Where user input could reach such a check, the boundary above checks it first and raises ``InputError``.
"""


class GnnpipeError(Exception):
    """Base class: the CLI prints ``str(err)`` on one line and exits non-zero, without a traceback."""


class InputError(GnnpipeError):
    """The user's parameters or input files are wrong."""


class ArtifactError(GnnpipeError):
    """A stored artifact is missing, incomplete or corrupted."""
