// The official `openai` npm client asking for tool calls and structured output: a whole
// and a streamed chat completion with tools and tool_choice "required" (the stream's
// tool_call deltas assembled the way OpenAI's docs show), and a response_format
// json_schema answer. Prints one JSON object on stdout for a pytest to judge (the sim
// directly in test_sim.py; the same script can run against the gateway).
//
// usage: node tools.mjs BASE_URL MODEL [API_KEY]
import OpenAI from "openai";

const [baseURL, model, apiKey] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node tools.mjs BASE_URL MODEL [API_KEY]");
  process.exit(2);
}
const client = new OpenAI({
  baseURL,
  apiKey: apiKey || "unused-no-api-key",
  maxRetries: 0, // a retry would hide a failure
  timeout: 30_000,
});

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather at a place",
    parameters: {
      type: "object",
      properties: {
        location: { type: "string" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["location", "unit"],
    },
  },
};
const schema = {
  type: "object",
  properties: { title: { type: "string" }, rating: { type: "integer", minimum: 1, maximum: 5 } },
  required: ["title", "rating"],
  additionalProperties: false,
};
const messages = [{ role: "user", content: "What is the weather in Oslo?" }];

const out = {};
try {
  const whole = await client.chat.completions.create({
    model, messages, tools: [weather], tool_choice: "required",
  });
  const c = whole.choices[0];
  out.whole = {
    finish_reason: c?.finish_reason ?? null,
    content: c?.message?.content ?? null,
    tool_calls: (c?.message?.tool_calls ?? []).map((t) => ({
      id: t.id, type: t.type, name: t.function?.name, arguments: t.function?.arguments,
    })),
    usage: whole.usage ?? null,
  };

  const stream = await client.chat.completions.create({
    model, messages, tools: [weather], tool_choice: "required",
    stream: true, stream_options: { include_usage: true },
  });
  const calls = []; // by index: id, type, name, arguments so far
  const s = { finish_reason: null, usage: null, chunks: 0, tool_call_chunks: 0, content: "" };
  for await (const chunk of stream) {
    s.chunks++;
    if (chunk.usage) s.usage = chunk.usage;
    const choice = chunk.choices?.[0];
    if (!choice) continue;
    if (choice.finish_reason) s.finish_reason = choice.finish_reason;
    if (choice.delta?.content) s.content += choice.delta.content;
    for (const d of choice.delta?.tool_calls ?? []) {
      s.tool_call_chunks++;
      const call = (calls[d.index] ??= { id: "", type: "", name: "", arguments: "" });
      if (d.id) call.id = d.id;
      if (d.type) call.type = d.type;
      if (d.function?.name) call.name += d.function.name;
      if (d.function?.arguments) call.arguments += d.function.arguments;
    }
  }
  out.stream = { ...s, tool_calls: calls };

  const structured = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Review a film." }],
    response_format: { type: "json_schema", json_schema: { name: "review", schema, strict: true } },
  });
  out.structured = {
    finish_reason: structured.choices[0]?.finish_reason ?? null,
    content: structured.choices[0]?.message?.content ?? null,
    schema,
  };
  out.ok = true;
} catch (e) {
  out.ok = false;
  out.error = { name: e?.name, message: String(e?.message ?? e), status: e?.status ?? null };
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(out.ok ? 0 : 1);
