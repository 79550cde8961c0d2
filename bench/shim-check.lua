-- wrk script: POSTs one token-bucket check to the shim's /v1/check, the body the filter
-- sends for one rule. Used by bench/run.py for "checks per second through the shim".
-- The limit is high enough that every check is admitted (and so written to Redis).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"checks":[{"key":"bench:{ceiling}","limit":1000000,"period_ms":1000}]}'
