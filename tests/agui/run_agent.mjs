// Runs one AG-UI run against the gateway with the official client (HttpAgent), whose built-in
// verifier rejects protocol violations. Prints one JSON line: the events seen, the messages the
// client assembled, and the error if the run failed.
// usage: node run_agent.mjs URL API_KEY THREAD_ID RUN_ID TEXT
import { HttpAgent } from "@ag-ui/client";

const [url, key, threadId, runId, text] = process.argv.slice(2);
const agent = new HttpAgent({ url, headers: { Authorization: `Bearer ${key}` }, threadId });
agent.addMessage({ id: `user-${runId}`, role: "user", content: text });
const events = [];
try {
  const result = await agent.runAgent({ runId }, { onEvent: ({ event }) => { events.push(event); } });
  console.log(JSON.stringify({ ok: true, events, messages: agent.messages, state: agent.state, result: result.result ?? null }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: String(error && error.message || error), events }));
  process.exitCode = 1;
}
