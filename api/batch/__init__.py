"""Batch jobs (the OpenAI Files + Batch API): input checks, one line's run, the driver."""
