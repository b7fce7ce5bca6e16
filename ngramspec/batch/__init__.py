"""`ngramspec batch`: document pipelines as a resumable job (see api.py, job.py)."""
from .api import batch
from .results import BatchResult

__all__ = ["batch", "BatchResult"]
