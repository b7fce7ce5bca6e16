"""`python -m ngramspec ...`: the same command line as the `ngramspec` console script."""
from .cli.main import run

if __name__ == "__main__":
    run()
