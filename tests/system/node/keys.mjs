// The official `openai` npm client against fleetgate over HTTPS with an API key
// (NODE_EXTRA_CA_CERTS names the test CA): one answer, and one request that first meets a
// 429 with Retry-After and must be retried by the client's own logic. Prints one JSON
// object for tests/system/test_front.py.
//
// usage: node keys.mjs BASE_URL MODEL API_KEY
import OpenAI from "openai";

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 3, timeout: 30_000 });
const out = {};
try {
  const { data, response } = await client.chat.completions
    .create({ model, messages: [{ role: "user", content: "hello over TLS" }], max_tokens: 8 })
    .withResponse();
  out.whole = { content: data.choices[0]?.message?.content ?? null,
                replica: response.headers.get("x-fleetgate-replica") };
  // the key allows one request at a time: a long one runs, the next meets 429 first
  const long = client.chat.completions.create({
    model, messages: [{ role: "user", content: "a long answer" }], max_tokens: 60 });
  await new Promise((r) => setTimeout(r, 200));
  const t0 = Date.now();
  const second = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "after the limit" }], max_tokens: 4 });
  out.retried = { ok: !!second.choices[0], waited_ms: Date.now() - t0 };
  await long;
  out.ok = true;
} catch (e) {
  out.ok = false;
  out.error = String(e);
  out.status = e.status ?? null;
}
console.log(JSON.stringify(out));
