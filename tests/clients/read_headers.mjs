// Sends requests as a client would and prints, one JSON line each, what the published
// `ratelimit-header-parser` (npm) read from the response. tests/client_libraries.rs runs
// it against real Envoy and compares with what the limiter decided.
//
//     node read_headers.mjs URL API_KEY REQUESTS
import { parseRateLimit } from 'ratelimit-header-parser';

const [url, apiKey, requests] = process.argv.slice(2);
for (let i = 0; i < Number(requests); i++) {
  const response = await fetch(url, { headers: { 'x-api-key': apiKey } });
  await response.arrayBuffer();
  const read = parseRateLimit(response);
  const number = (value) => (value === undefined || Number.isNaN(value) ? null : value);
  const reset = read?.reset?.getTime();
  console.log(JSON.stringify({
    status: response.status,
    limit: number(read?.limit),
    remaining: number(read?.remaining),
    reset: reset === undefined || Number.isNaN(reset) ? null : reset / 1000,
    received_at: Date.now() / 1000,
  }));
}
