"""Executing blocksim's steps on a GPU: the model's forward pass (`model`), GPU-in-the-loop replay
(`step_executor`, ``blocksim replay --executor cuda``), cost profiles measured with the same code
(`profile`, ``blocksim profile``), and the recorded-plan checker (`executor`, `kv`, ``blocksim
validate``) with its roofline calibration (`calibrate`)."""
