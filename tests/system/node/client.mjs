// The official `openai` npm client pointed at fleetgate: one non-streamed and one streamed
// chat completion. Prints one JSON object on stdout for tests/system/test_gateway.py to
// judge: the answers, the request ids and replicas the gateway named, and when (ms since
// the streamed request was sent) each stream chunk arrived.
//
// usage: node client.mjs BASE_URL MODEL [MAX_TOKENS]
import OpenAI from "openai";

const [baseURL, model, maxTokensArg] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node client.mjs BASE_URL MODEL [MAX_TOKENS]");
  process.exit(2);
}
const maxTokens = Number(maxTokensArg || 20);

const client = new OpenAI({
  baseURL,
  apiKey: "unused-no-api-keys-yet",
  maxRetries: 0, // a retry would hide a gateway failure
  timeout: 30_000,
});

const out = {};
try {
  // non-streamed
  const { data: whole, response } = await client.chat.completions
    .create({
      model,
      messages: [{ role: "user", content: "Hello from the openai npm client" }],
      max_tokens: maxTokens,
    })
    .withResponse();
  out.whole = {
    id: whole.id,
    object: whole.object,
    model: whole.model,
    system_fingerprint: whole.system_fingerprint ?? null,
    content: whole.choices[0]?.message?.content ?? null,
    finish_reason: whole.choices[0]?.finish_reason ?? null,
    usage: whole.usage ?? null,
    request_id: response.headers.get("x-request-id"),
    replica: response.headers.get("x-fleetgate-replica"),
  };

  // streamed: record when each chunk arrives
  const t0 = performance.now();
  const { data: stream, response: sresp } = await client.chat.completions
    .create({
      model,
      messages: [{ role: "user", content: "Stream to me from the openai npm client" }],
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
    })
    .withResponse();
  const chunks = [];
  let text = "";
  for await (const chunk of stream) {
    const c = chunk.choices?.[0];
    const delta = c?.delta?.content ?? "";
    text += delta;
    chunks.push({
      t_ms: performance.now() - t0,
      object: chunk.object,
      content: delta,
      finish_reason: c?.finish_reason ?? null,
      usage: chunk.usage ?? null,
      system_fingerprint: chunk.system_fingerprint ?? null,
    });
  }
  out.stream = {
    request_id: sresp.headers.get("x-request-id"),
    replica: sresp.headers.get("x-fleetgate-replica"),
    content_type: sresp.headers.get("content-type"),
    text,
    chunks,
    total_ms: performance.now() - t0,
  };
  out.ok = true;
} catch (e) {
  out.ok = false;
  out.error = { name: e?.name, message: String(e?.message ?? e), status: e?.status ?? null };
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(out.ok ? 0 : 1);
