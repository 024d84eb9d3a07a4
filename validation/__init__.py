"""Executing a recorded plan on the GPU: the plan executor (`executor`, `kv`), `blocksim validate`
(`validate`) and the cost-model calibration from its timings (`calibrate`)."""
