"""User-facing errors. Each carries one line that says what went wrong and what to do about it."""


class GnnpipeError(Exception):
    """Base class: the CLI prints ``str(err)`` on one line and exits non-zero, without a traceback."""


class InputError(GnnpipeError):
    """The user's parameters or input files are wrong."""


class ArtifactError(GnnpipeError):
    """A stored artifact is missing, incomplete or corrupted."""
