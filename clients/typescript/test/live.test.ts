// The client against a live memlane (the test stack `make test` starts): MEMLANE_URL, an agent key
// (MEMLANE_KEY) and an operator key of the deployment (MEMLANE_OPERATOR_KEY) for tenant
// MEMLANE_TENANT and agent MEMLANE_AGENT. No network but the API's.
import assert from "node:assert/strict";
import { test } from "node:test";

import { MemlaneClient, MemlaneError } from "../src/index.js";

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests through tests/e2e/test_typescript_client.py`);
  return value;
}

const baseUrl = env("MEMLANE_URL");
const agent = () => new MemlaneClient({ baseUrl, apiKey: env("MEMLANE_KEY"), session: "ts-1" });
const operator = () => new MemlaneClient({ baseUrl, apiKey: env("MEMLANE_OPERATOR_KEY"), tenant: env("MEMLANE_TENANT"),
                                           agent: env("MEMLANE_AGENT") });

test("a memory written is read, listed, searched, recalled and deleted", async () => {
  const c = agent();
  const written = await c.addMemory({ summary: "The staging database lives in Frankfurt", kind: "fact" });
  assert.equal(written.status, "applied");
  const [record] = written.memories;
  assert.equal((await c.readMemory(record.id)).summary, "The staging database lives in Frankfurt");
  assert.ok((await c.listMemory({ first: 50 })).records.some((r) => r.id === record.id));
  const found = await c.searchMemory({ query: "where is the staging database?" });
  assert.equal(found.records[0].id, record.id);
  assert.equal(typeof found.records[0].score, "number");
  const recalled = await c.recall({ conversation: "ts-c1", text: "where is the staging database?" });
  assert.match(recalled.rendered, /Frankfurt/);
  const versions = await c.memoryHistory(record.id);
  assert.deepEqual(versions.versions.map((v) => v.version), [1]);
  await c.deleteMemory(record.id);
  assert.equal((await c.readMemory(record.id)).status, "DELETED");
  assert.ok(!(await c.searchMemory({ query: "staging database" })).records.some((r) => r.id === record.id));
});

test("a refusal is a MemlaneError naming its code and field", async () => {
  const c = agent();
  await assert.rejects(c.addMemory({ summary: "x".repeat(100_000) }), (e: unknown) => {
    assert.ok(e instanceof MemlaneError);
    assert.equal(e.status, 422);
    assert.equal(e.field, "summary");
    assert.equal(e.code, "VALIDATION_FAILED");
    return true;
  });
  await assert.rejects(c.readMemory("no-such-record"), (e: unknown) => e instanceof MemlaneError && e.status === 404);
  const stranger = new MemlaneClient({ baseUrl, apiKey: "not-a-key" });
  await assert.rejects(stranger.listMemory(), (e: unknown) => e instanceof MemlaneError && e.status === 401);
});

test("an operator issues, lists and revokes a key, which then stops working", async () => {
  const op = operator();
  const issued = await op.issueKey({ tenant: env("MEMLANE_TENANT"), agent: env("MEMLANE_AGENT"), role: "helper" });
  assert.equal(issued.role, "helper");
  assert.ok((await op.listKeys(env("MEMLANE_TENANT"))).some((k) => k.id === issued.id));
  const helper = new MemlaneClient({ baseUrl, apiKey: issued.key });
  assert.equal((await helper.whoami()).role, "helper");
  await op.revokeKey(issued.id, env("MEMLANE_TENANT"));
  await assert.rejects(helper.whoami(), (e: unknown) => e instanceof MemlaneError && e.status === 401);
});

test("a call fails over from a replica that is down to one that answers", async () => {
  const c = new MemlaneClient({ baseUrl: ["http://127.0.0.1:9", baseUrl], apiKey: env("MEMLANE_KEY"), session: "ts-1" });
  assert.ok(Array.isArray((await c.listMemory()).records));
});
