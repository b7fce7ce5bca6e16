"""`python -m ngramspec.server [serve flags]` == `ngramspec serve [flags]`."""
import sys

from ngramspec.cli.main import main

if __name__ == "__main__":
    main(["serve", *sys.argv[1:]], obj={}, prog_name="ngramspec serve")
