"""`python -m blocksim` and the `blocksim` command (``run``). Loading the command's modules takes a
moment (pandas, pyarrow); a Ctrl-C then ends as it does during a run: one line and exit status 130."""

import sys


def run() -> int:
    try:
        from blocksim.cli import main
    except KeyboardInterrupt:
        print("blocksim: interrupted while starting; nothing was written", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
