"""Media in requests (images, audio): where their bytes come from and how they reach a job."""
