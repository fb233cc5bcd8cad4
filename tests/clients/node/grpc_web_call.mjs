// A gRPC-Web client of lmserve (Connect-ES over HTTP/1.1): ListModels, Score, a seeded Generate
// stream and an error, printed as one JSON line for tests/integration/test_grpc_web.py.
import { createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-node";
import { LanguageModelService } from "./gen/lmserve/v1/lm_service_pb.js";
const [baseUrl, model] = process.argv.slice(2);
const transport = createGrpcWebTransport({ baseUrl, httpVersion: "1.1" });
const client = createClient(LanguageModelService, transport);
const out = {};
const list = await client.listModels({});
out.models = list.models.map((m) => m.name);
const scored = await client.score({ model, texts: ["and god said", "the lord is my shepherd"] });
out.scores = scored.results.map((r) => [r.logProb, r.tokenCount]);
const tokens = [];
for await (const message of client.generate({ model, prompt: "and god", stopping: { maxNewTokens: 5 }, sampling: { seed: 3n } })) {
  for (const t of message.tokens) tokens.push(t.tokenId);
}
out.generated = tokens;
try { await client.score({ model: "no-such-model", texts: ["a"] }); } catch (e) { out.error = [e.code, e.rawMessage]; }
console.log(JSON.stringify(out));
