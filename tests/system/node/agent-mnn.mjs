// The official `openai` npm client against fleetgate-agent fronting an MNN-flavoured
// sim: one whole and one streamed chat completion with a token cap. Prints one JSON
// object on stdout for tests/system/test_agent.py to judge.
//
// usage: node agent-mnn.mjs BASE_URL TOKEN MODEL MAX_TOKENS
import OpenAI from "openai";

const [baseURL, apiKey, model, maxTokensArg] = process.argv.slice(2);
if (!baseURL || !apiKey || !model) {
  console.error("usage: node agent-mnn.mjs BASE_URL TOKEN MODEL MAX_TOKENS");
  process.exit(2);
}
const maxTokens = Number(maxTokensArg || 5);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30_000 });
const messages = [{ role: "user", content: "Hello from the openai npm client through the agent" }];

const out = {};
try {
  const whole = await client.chat.completions.create({ model, messages, max_tokens: maxTokens });
  out.whole = {
    object: whole.object,
    content: whole.choices[0]?.message?.content ?? null,
    role: whole.choices[0]?.message?.role ?? null,
    finish_reason: whole.choices[0]?.finish_reason ?? null,
    usage: whole.usage ?? null,
  };
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) {
    const c = chunk.choices?.[0];
    chunks.push({
      object: chunk.object,
      n_choices: chunk.choices?.length ?? 0,
      content: c?.delta?.content ?? null,
      finish_reason: c === undefined ? "(no choice)" : (c.finish_reason ?? null),
      usage: chunk.usage ?? null,
    });
  }
  out.stream = { chunks };
  out.ok = true;
} catch (e) {
  out.ok = false;
  out.error = { name: e?.name, message: String(e?.message ?? e), status: e?.status ?? null };
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(out.ok ? 0 : 1);
