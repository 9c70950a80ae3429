// The official `openai` npm client runs OpenAI's Batch API flow against fleetgate, as a
// user's program would, unchanged: upload a.jsonl (files.create with fs.createReadStream),
// create a batch of it, poll batches.retrieve until it ends, read the output and error
// files (files.content); then upload b.jsonl (a bigger, slower batch), cancel it once a
// line has completed, poll until it is cancelled, read what it left; then list batches
// and files (one item a page, so the client follows `after` cursors itself). Prints one
// JSON object on stdout for tests/system/test_batch.py to judge: every object the client
// got, as it got it.
//
// usage: node batch.mjs BASE_URL DIR   (DIR holds a.jsonl and b.jsonl)
import fs from "node:fs";
import path from "node:path";
import OpenAI from "openai";

const [baseURL, dir] = process.argv.slice(2);
if (!baseURL || !dir) {
  console.error("usage: node batch.mjs BASE_URL DIR");
  process.exit(2);
}

const client = new OpenAI({
  baseURL,
  apiKey: "unused-no-api-keys",
  maxRetries: 0, // a retry would hide a gateway failure
  timeout: 30_000,
});

const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Poll until done(batch) or the deadline; every status seen, in order, without repeats.
async function poll(id, done, deadlineMs) {
  const seen = [];
  const t0 = performance.now();
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (seen[seen.length - 1] !== b.status) seen.push(b.status);
    if (done(b)) return { batch: b, seen, timed_out: false };
    if (performance.now() - t0 > deadlineMs) return { batch: b, seen, timed_out: true };
    await sleep(100);
  }
}

async function content(id) {
  if (!id) return null;
  const resp = await client.files.content(id);
  return await resp.text();
}

const out = {};
let step = "start";
try {
  // --- a: the whole flow to completed
  step = "files.create a";
  out.file_a = await client.files.create({
    file: fs.createReadStream(path.join(dir, "a.jsonl")),
    purpose: "batch",
  });
  step = "batches.create a";
  out.created_a = await client.batches.create({
    input_file_id: out.file_a.id,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
    metadata: { suite: "node", part: "a" },
  });
  step = "poll a";
  const a = await poll(out.created_a.id, (b) => TERMINAL.has(b.status), 60_000);
  out.batch_a = a.batch;
  out.seen_a = a.seen;
  out.timed_out_a = a.timed_out;
  step = "files.content a";
  out.output_a = await content(a.batch.output_file_id);
  out.error_a = await content(a.batch.error_file_id);
  step = "files.retrieve a output";
  out.output_file_a = a.batch.output_file_id ? await client.files.retrieve(a.batch.output_file_id) : null;
  out.error_file_a = a.batch.error_file_id ? await client.files.retrieve(a.batch.error_file_id) : null;

  // --- b: cancelled once a line has completed
  step = "files.create b";
  out.file_b = await client.files.create({
    file: fs.createReadStream(path.join(dir, "b.jsonl")),
    purpose: "batch",
  });
  step = "batches.create b";
  out.created_b = await client.batches.create({
    input_file_id: out.file_b.id,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
  });
  step = "poll b running";
  const running = await poll(out.created_b.id,
    (b) => TERMINAL.has(b.status) || (b.request_counts?.completed ?? 0) >= 1, 30_000);
  out.before_cancel_b = running.batch;
  step = "batches.cancel b";
  out.cancel_b = await client.batches.cancel(out.created_b.id);
  step = "poll b cancelled";
  const b = await poll(out.created_b.id, (x) => TERMINAL.has(x.status), 30_000);
  out.batch_b = b.batch;
  out.seen_b = running.seen.concat(b.seen);
  out.timed_out_b = running.timed_out || b.timed_out;
  step = "files.content b";
  out.output_b = await content(b.batch.output_file_id);
  out.error_b = await content(b.batch.error_file_id);

  // --- lists: the first page of one, then every page (the client follows `after`)
  step = "batches.list";
  const first = await client.batches.list({ limit: 1 });
  out.batches_first_page = { ids: first.data.map((x) => x.id), has_more: first.has_more };
  out.batches_all = [];
  for await (const x of client.batches.list({ limit: 1 })) out.batches_all.push(x.id);
  step = "files.list";
  out.files_batch = [];
  for await (const f of client.files.list({ purpose: "batch", limit: 1 })) out.files_batch.push(f.id);
  out.files_output = [];
  for await (const f of client.files.list({ purpose: "batch_output", limit: 1 })) out.files_output.push(f.id);
  out.ok = true;
} catch (e) {
  out.ok = false;
  out.error = { step, name: e?.name, message: String(e?.message ?? e), status: e?.status ?? null };
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(out.ok ? 0 : 1);
