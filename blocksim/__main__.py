"""`python -m blocksim` and the `blocksim` command (``run``). Loading the command's modules takes a
moment (pandas, pyarrow); a Ctrl-C then ends as it does during a run: one line and exit status 130.

Arrow's buffers (pandas' strings, the Parquet writer's pages) come from the system allocator
unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise: it hands freed memory back, where Arrow's
default (mimalloc) keeps its arenas, 20 MB more at the peak of a replay of an hour of requests."""

import os
import sys


def run() -> int:
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # read when pyarrow is first imported
    try:
        from blocksim.cli import main
    except KeyboardInterrupt:
        print("blocksim: interrupted while starting; nothing was written", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
