"""`python -m blocksim` and the `blocksim` command (``run``). Loading the command's modules takes a
moment (pandas, pyarrow); a Ctrl-C then ends as it does during a run: one line and exit status 130.

Arrow's buffers (pandas' strings, the Parquet writer's pages) come from the system allocator
unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise: it hands freed memory back, where Arrow's
default (mimalloc) keeps its arenas, 20 MB more at the peak of a replay of an hour of requests.

The command's objects are left to the operating system at exit: the interpreter's last cyclic
garbage collection would otherwise walk every request and sequence of a run (65 ms after a replay
of an hour of requests) only to free memory the process is about to give back whole."""

import gc
import os
import sys


def run() -> int:
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # read when pyarrow is first imported
    try:
        from blocksim.cli import main
    except KeyboardInterrupt:
        print("blocksim: interrupted while starting; nothing was written", file=sys.stderr)
        return 130
    code = main()
    gc.freeze()  # the interpreter's collection at exit skips every object tracked now
    return code


if __name__ == "__main__":
    sys.exit(run())
