"""Decode-attention benchmark, ``python -m kernels.bench`` (``cli.py`` lists the sections and
flags): ``timing`` (CUDA-graph timing, SDPA backends), ``cases`` (one shape's data and timed
calls), ``stats`` (paired ratios and their confidence intervals), ``sections`` (the measured
tables), ``plot`` (the sweep's plot). Importing it needs no torch; running it needs a CUDA device.
"""
