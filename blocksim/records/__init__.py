"""What a run leaves: step records (`steps`), the finished run and its run directory (`result`),
and the execution plan for GPU validation (`plan`)."""
