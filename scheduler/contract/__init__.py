"""The shared ground of both roles: the job contract (kinds, jobs, sampling, results and
events), the one error table, the limits and the Redis keys. Imports only scheduler.config."""
