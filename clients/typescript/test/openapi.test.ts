// The client against the OpenAPI document the API serves (kept in the repository as
// tests/unit/openapi.json): every request type has the body schema's fields, and every call goes
// to a path and method the API has.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { MemlaneClient } from "../src/index.js";
import type {
  AddRequest, HistorySearchRequest, KeyRequest, ProfileRequest, RecallRequest, SaveNoteRequest, SearchRequest,
} from "../src/index.js";

const doc = JSON.parse(readFileSync(new URL("../../../../tests/unit/openapi.json", import.meta.url), "utf8"));

function fields(schema: string): string[] {
  return Object.keys(doc.components.schemas[schema].properties).sort();
}

// `satisfies Required<T>`: the compiler refuses a missing or an extra field, so these lists are the types' fields.
const requests: Record<string, object> = {
  AddRequest: {
    summary: "", content: "", kind: null, scope: null, labels: {}, metadata: {}, tags: [], key: null, pinned: false,
    replaces: null, confidence: null, importance: null, classification: null, expires_at: null, observed_at: null,
    valid_from: null, valid_to: null, run_id: null, layer: null, source_ref: null, expected_version: null,
    command_id: null,
  } satisfies Required<AddRequest>,
  SearchRequest: {
    query: null, kind: null, labels: {}, tags: [], ids: [], limit: null, after: null, mode: null, min_score: null,
    as_of: null,
  } satisfies Required<SearchRequest>,
  RecallRequest: {
    conversation: "", text: "", run_id: null, application: null, request_id: null, as_of: null,
  } satisfies Required<RecallRequest>,
  HistorySearchRequest: {
    query: null, scope: "", kind: "", conversation: null, session: null, turn: null, day: null, since: null,
    until: null, now: null, ids: [], limit: 0, cursor: null, mode: null,
  } satisfies Required<HistorySearchRequest>,
  SaveNoteRequest: { topic: "", summary: "", source_messages: [], expected_revision: 0 } satisfies Required<SaveNoteRequest>,
  ProfileRequest: { text: "", expected_version: null } satisfies Required<ProfileRequest>,
  KeyRequest: { tenant: "", agent: null, role: "agent", user: null } satisfies Required<KeyRequest>,
};

test("each request type has its schema's fields", () => {
  for (const [schema, example] of Object.entries(requests)) {
    assert.deepEqual(Object.keys(example).sort(), fields(schema), schema);
  }
});

test("each call goes to a path and method of the API", async () => {
  const calls: [string, string][] = [];
  const recording: typeof fetch = async (url, init) => {
    calls.push([init?.method ?? "GET", new URL(String(url)).pathname]);
    return new Response("{}", { status: 200 });
  };
  const c = new MemlaneClient({ baseUrl: "http://memlane.invalid", apiKey: "k", fetch: recording });
  await c.addMemory({ summary: "s" });
  await c.readMemory("r1");
  await c.listMemory();
  await c.memoryHistory("r1");
  await c.deleteMemory("r1");
  await c.searchMemory({ query: "q" });
  await c.recall({ conversation: "c", text: "t" });
  await c.searchHistory({ query: "q" });
  await c.messageHistory();
  await c.searchNotes();
  await c.saveNote("n1", { topic: "t", summary: "s", source_messages: [], expected_revision: 0 });
  await c.readNote("n1");
  await c.readProfile("dana");
  await c.writeProfile("dana", { text: "t" });
  await c.consent();
  await c.grantConsent();
  await c.withdrawConsent();
  await c.issueKey({ tenant: "t" });
  await c.listKeys().catch(() => undefined); // the recorded answer has no `keys`; the call is what counts
  await c.revokeKey("k1");
  await c.whoami();
  const templates = Object.entries(doc.paths).flatMap(([path, ops]) =>
    Object.keys(ops as object).map((m) => [m.toUpperCase(), new RegExp(`^${path.replace(/\{[^}]+\}/g, "[^/]+")}$`)] as const));
  for (const [method, path] of calls) {
    assert.ok(templates.some(([m, re]) => m === method && re.test(path)), `${method} ${path} is not in the API`);
  }
  assert.equal(calls.length, 21);
});
