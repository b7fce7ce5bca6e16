"""`ngramspec batch`: document pipelines as a resumable job (see api.py, job.py).

`batch` and `BatchResult` are imported at first use: the command line registers
`ngramspec.batch.command` for every command, and the job's modules (the scheduler,
the request types) would otherwise load on every `generate`."""

__all__ = ["batch", "BatchResult"]


def __getattr__(name: str):
    if name == "batch":
        from .api import batch
        return batch
    if name == "BatchResult":
        from .results import BatchResult
        return BatchResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
