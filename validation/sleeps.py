"""The sleeps the step executor queues on the GPU ahead of the work it times (torch-free, so that
planning tools such as `benchmarks/fidelity_runs.py estimate` read them without a GPU stack).

A sleep before a timed segment lets the host queue the segment's launches before the GPU reaches
them, so the segment's CUDA events hold GPU work only (`validation.step_executor`)."""

LEAD_S = 1.2e-3         # sleep queued before each eager segment (one layer): covers its launches
GRAPH_LEAD_S = 50e-6    # before a graph replay (one launch)
RETIME_LEAD_S = 4 * LEAD_S  # per segment (or before a graph replay), when a forward is timed again
