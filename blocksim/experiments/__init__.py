"""Experiments over the engine: one replay (`runner`), sweeps over a grid of points on local cores
or Ray (`spec`, `points`, `backends`, `search`, `sweep`), and policy comparisons (`compare`); run
directories that appear whole or not at all (`rundir`) and config files of options (`configfile`)."""
