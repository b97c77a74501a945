"""The launcher's errors, job-neutral: the caller names its job (``JobKind``) and the messages say that name.

Torch- and psutil-free, so a stage module can declare its ``JobKind`` at import without loading the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.errors import GnnpipeError


class JobError(GnnpipeError):
    """A distributed job failed: a rank died or raised, or the job ran out of time (the job's kind subclasses it)."""


class TrainingError(JobError):
    """The training job failed: a rank died or raised, or the job ran out of time."""


@dataclass(frozen=True)
class JobKind:
    """What the launcher's errors say about the job it runs, given by the caller: the messages name the job and,
    for a job that keeps checkpoints, that a rerun resumes; the launcher itself knows no stage."""

    name: str                    # the errors' first word: "training", "inference"
    error: type[JobError]        # the class of its errors, so callers catch their own job's failures
    checkpoints: bool            # the job keeps checkpoints: a failure's message says a rerun resumes
    timeout_advice: str          # appended to "... timed out after N s and was stopped"; may name {timeout_s}


# training is the launcher's default job (its tests and benchmarks run one); the wording is what users have seen
TRAINING = JobKind("training", TrainingError, checkpoints=True,
                   timeout_advice=" (checkpoints kept: rerun, or raise timeout_s, to resume)")
