// A Connect client of lmserve over HTTP/2 (h2c), Connect-ES in Node: a Score, then a Complete
// session driven full-duplex (each keystroke sent only after the previous answer arrived),
// printed as one JSON line for tests/integration/test_http2.py.
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { LanguageModelService } from "./gen/lmserve/v1/lm_service_pb.js";

const [baseUrl, model] = process.argv.slice(2);
const transport = createConnectTransport({ baseUrl, httpVersion: "2", useBinaryFormat: false });
const client = createClient(LanguageModelService, transport);
const out = {};
const scored = await client.score({ model, texts: ["and god said"] });
out.score = [scored.results[0].logProb, scored.results[0].tokenCount];

// Full duplex: the next message waits for the answer to the previous one.
let answered;
let next = new Promise((resolve) => (answered = resolve));
async function* keystrokes() {
  yield { model, appendText: "and god", k: 3 };
  const first = await next;
  next = new Promise((resolve) => (answered = resolve));
  yield { partialWord: first.completions[0].word.slice(0, 1), k: 3 };
}
out.answers = [];
for await (const answer of client.complete(keystrokes())) {
  out.answers.push(answer.completions.map((c) => c.word));
  answered(answer);
  if (out.answers.length === 2) break;
}
console.log(JSON.stringify(out));
