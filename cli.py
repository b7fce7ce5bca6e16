"""Top-level entry: `python cli.py ...` is the same as the `ngramspec` command."""
from ngramspec.cli.main import run

if __name__ == "__main__":
    run()
