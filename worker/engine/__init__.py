"""The slot engine: its loop and inbox, admission, the step's plan and batch, prefill, slot start
and run, the runs' endings, request preparation, sampling, token steps and probabilities,
stopping, text streaming, reasoning, infill, message spans, reporting and draft verification."""
