// The official `openai` npm client's Responses API through the gateway, unchanged: a whole
// `client.responses.create` and one with `stream: true` (its events read as they come),
// and a refusal (previous_response_id) as the client raises it. Prints one JSON object on
// stdout for a pytest to judge (test_responses.py, test_llama.py).
//
// usage: node responses.mjs BASE_URL MODEL [API_KEY]
import OpenAI from "openai";

const [baseURL, model, apiKey] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node responses.mjs BASE_URL MODEL [API_KEY]");
  process.exit(2);
}
const client = new OpenAI({
  baseURL,
  apiKey: apiKey || "unused-no-api-key",
  maxRetries: 0, // a retry would hide a failure
  timeout: 60_000,
});

const out = {};
const whole = await client.responses.create({
  model,
  instructions: "Answer briefly.",
  input: "Say hello.",
  max_output_tokens: 16,
});
out.whole = {
  id: whole.id, object: whole.object, status: whole.status, output_text: whole.output_text,
  output_types: whole.output.map((o) => o.type), usage: whole.usage,
  incomplete_details: whole.incomplete_details,
};

const stream = await client.responses.create({
  model,
  input: [{ role: "user", content: [{ type: "input_text", text: "Say hello again." }] }],
  max_output_tokens: 16,
  stream: true,
});
const types = [];
let text = "", reasoning = "", final = null, seq = [];
for await (const ev of stream) {
  types.push(ev.type);
  seq.push(ev.sequence_number);
  if (ev.type === "response.output_text.delta") text += ev.delta;
  if (ev.type === "response.reasoning_text.delta") reasoning += ev.delta;
  if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
}
out.stream = {
  types, seq, text, reasoning, status: final && final.status, usage: final && final.usage,
  final_text: final && final.output.filter((o) => o.type === "message")
    .map((o) => o.content.map((c) => c.text).join("")).join(""),
  final_reasoning: final && final.output.filter((o) => o.type === "reasoning")
    .map((o) => o.content.map((c) => c.text).join("")).join(""),
};

try {
  await client.responses.create({ model, input: "more", previous_response_id: whole.id });
  out.refused = null;
} catch (e) {
  out.refused = { status: e.status, code: e.code, param: e.param, message: e.message };
}
console.log(JSON.stringify(out));
