"""Prefect tasks: each wraps one domain call with retries (transient errors only), timeouts and
task run names that carry the run id and step."""
