-- wrk script: POSTs to the shim's /v1/check-batch a batch of one request of one
-- token-bucket check, each on the next of 2,000 keys: what an Envoy worker sends at a
-- moderate rate. Used by bench/coalescing.py. Every check is admitted.
local counter = 0
request = function()
  counter = counter + 1
  local body = '{"requests":[{"checks":[{"key":"co:' .. (counter % 2000)
    .. '","limit":1000000,"period_ms":60000}]}]}'
  return wrk.format("POST", "/v1/check-batch", {["Content-Type"] = "application/json"}, body)
end
