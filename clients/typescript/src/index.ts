// A typed client for memlane's HTTP API: memory, recall, search, history, notes, profiles,
// consent and keys. Refusals are `MemlaneError`s carrying the API's `code` and `field`.
//
// A call that may have reached a replica is sent again only when that is safe: a read, or a
// write naming its command id or request id (every write this client makes names one). Each
// answer's log position is remembered and sent back, so what this client wrote or saw is never
// missing from its next read on another replica.

import { randomUUID } from "node:crypto";

import type {
  AddRequest, Consent, HistorySearchRequest, KeyEntry, KeyRequest, ListOptions, MemoryRecord, Page, Profile,
  ProfileRequest, RecallRequest, RecallResult, SaveNoteRequest, SearchRequest, SearchResult, WriteResult,
} from "./types.js";

export type * from "./types.js";

export class MemlaneError extends Error {
  constructor(readonly status: number, readonly code: string, readonly field: string | null, message: string) {
    super(`${status} ${code}: ${message}`);
    this.name = "MemlaneError";
  }
}

export interface ClientOptions {
  /** The API, or several replicas: a replica that cannot be reached or answers 503 is left for the next. */
  baseUrl: string | string[];
  apiKey: string;
  /** The session the calls act in (X-Session), its member (X-User) and channel (X-Channel). */
  session?: string;
  user?: string;
  channel?: string;
  /** An operator key names the tenant and agent it acts on. */
  tenant?: string;
  agent?: string;
  /** How long a call keeps trying other replicas, in ms. */
  failoverMs?: number;
  /** Each attempt's time limit, in ms. */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

type Query = Record<string, string | number | boolean | undefined | null>;

export class MemlaneClient {
  private readonly urls: string[];
  private readonly headers: Record<string, string>;
  private readonly positions = new Map<number, number>();
  private at = 0;

  constructor(private readonly options: ClientOptions) {
    this.urls = (Array.isArray(options.baseUrl) ? options.baseUrl : [options.baseUrl]).map((u) => u.replace(/\/+$/, ""));
    if (this.urls.length === 0) throw new TypeError("baseUrl: name at least one API address");
    this.headers = { Authorization: `Bearer ${options.apiKey}` };
    const named: [string, string | undefined][] = [
      ["X-Session", options.session], ["X-User", options.user], ["X-Channel", options.channel],
      ["X-Tenant", options.tenant], ["X-Agent", options.agent],
    ];
    for (const [name, value] of named) if (value !== undefined) this.headers[name] = value;
  }

  // ---------------------------------------------------------------- memory

  addMemory(request: AddRequest, wait = true): Promise<WriteResult> {
    return this.call("POST", "/v1/memory", { wait }, { command_id: randomUUID(), ...request });
  }

  readMemory(id: string, options: { version?: number; as_of?: string } = {}): Promise<MemoryRecord> {
    return this.call("GET", `/v1/memory/${encodeURIComponent(id)}`, options);
  }

  listMemory(options: ListOptions = {}): Promise<Page> {
    return this.call("GET", "/v1/memory", { ...options });
  }

  memoryHistory(id: string, options: { first?: number; after?: string; as_of?: string } = {}):
    Promise<{ versions: MemoryRecord[]; next_cursor: string | null }> {
    return this.call("GET", `/v1/memory/${encodeURIComponent(id)}/history`, options);
  }

  deleteMemory(id: string, expectedVersion?: number): Promise<WriteResult> {
    return this.call("DELETE", `/v1/memory/${encodeURIComponent(id)}`, { expected_version: expectedVersion });
  }

  searchMemory(request: SearchRequest): Promise<SearchResult> {
    return this.call("POST", "/v1/memory/search", {}, request);
  }

  recall(request: RecallRequest): Promise<RecallResult> {
    return this.call("POST", "/v1/recall", {}, { request_id: randomUUID(), ...request });
  }

  // ---------------------------------------------------------------- history

  searchHistory(request: HistorySearchRequest): Promise<Record<string, unknown>> {
    return this.call("POST", "/v1/history/search", {}, request);
  }

  messageHistory(options: { conversation?: string; cursor?: string; limit?: number } = {}):
    Promise<Record<string, unknown>> {
    return this.call("GET", "/v1/history/messages", options);
  }

  // ---------------------------------------------------------------- notes, profiles, consent

  searchNotes(options: { query?: string; limit?: number; cursor?: string } = {}): Promise<Record<string, unknown>> {
    return this.call("GET", "/v1/notes", options);
  }

  saveNote(id: string, request: SaveNoteRequest): Promise<Record<string, unknown>> {
    return this.call("PUT", `/v1/notes/${encodeURIComponent(id)}`, {}, request);
  }

  readNote(id: string): Promise<Record<string, unknown>> {
    return this.call("GET", `/v1/notes/${encodeURIComponent(id)}`);
  }

  readProfile(user: string): Promise<Profile> {
    return this.call("GET", `/v1/profiles/${encodeURIComponent(user)}`);
  }

  writeProfile(user: string, request: ProfileRequest): Promise<Record<string, unknown>> {
    return this.call("PUT", `/v1/profiles/${encodeURIComponent(user)}`, {}, request);
  }

  consent(): Promise<Consent> {
    return this.call("GET", "/v1/consent");
  }

  grantConsent(): Promise<Record<string, unknown>> {
    return this.call("POST", "/v1/consent");
  }

  withdrawConsent(): Promise<Record<string, unknown>> {
    return this.call("DELETE", "/v1/consent");
  }

  // ---------------------------------------------------------------- keys (operator keys)

  async issueKey(request: KeyRequest): Promise<KeyEntry & { key: string }> {
    return this.call("POST", "/v1/admin/keys", {}, request);
  }

  async listKeys(tenant?: string): Promise<KeyEntry[]> {
    return (await this.call<{ keys: KeyEntry[] }>("GET", "/v1/admin/keys", { tenant })).keys;
  }

  async revokeKey(id: string, tenant?: string): Promise<unknown> {
    return (await this.call<{ revoked: unknown }>("DELETE", `/v1/admin/keys/${encodeURIComponent(id)}`, { tenant }))
      .revoked;
  }

  whoami(): Promise<{ role: string; tenant: string; agent: string | null; [field: string]: unknown }> {
    return this.call("GET", "/v1/whoami");
  }

  // ---------------------------------------------------------------- transport

  private async call<T>(method: string, path: string, query: Query = {}, body?: object): Promise<T> {
    const resp = await this.send(method, path, query, body);
    const text = await resp.text();
    if (resp.status >= 400) {
      let error: { code?: string; field?: string | null; message?: string } | undefined;
      try {
        error = JSON.parse(text).error;
      } catch {
        error = undefined;
      }
      throw new MemlaneError(resp.status, error?.code ?? "HTTP_ERROR", error?.field ?? null, error?.message ?? text);
    }
    return JSON.parse(text) as T;
  }

  private async send(method: string, path: string, query: Query, body?: object): Promise<Response> {
    const fetcher = this.options.fetch ?? fetch;
    const safe = method === "GET" || (body !== undefined && ("command_id" in body || "request_id" in body))
      || path === "/v1/memory/search";
    const deadline = Date.now() + (this.options.failoverMs ?? 10_000);
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) search.set(k, String(v));
    const qs = search.size ? `?${search}` : "";
    for (let tried = 1; ; tried++) {
      const headers: Record<string, string> = { ...this.headers };
      if (body !== undefined) headers["Content-Type"] = "application/json";
      if (this.positions.size) {
        headers["X-Memlane-After"] = [...this.positions].sort(([a], [b]) => a - b).map(([p, o]) => `${p}:${o}`).join(",");
      }
      let resp: Response | undefined;
      try {
        resp = await fetcher(`${this.urls[this.at]}${path}${qs}`, {
          method, headers, body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(this.options.timeoutMs ?? 30_000),
        });
      } catch (e) {
        // A request that never connected is safe to send elsewhere; one that may have arrived only when safe.
        if (!(safe || isConnectFailure(e)) || Date.now() >= deadline) throw e;
      }
      if (resp !== undefined && !(resp.status === 503 && safe && Date.now() < deadline)) {
        this.note(resp);
        return resp;
      }
      this.at = (this.at + 1) % this.urls.length;
      if (tried % this.urls.length === 0) await new Promise((r) => setTimeout(r, 200));
    }
  }

  private note(resp: Response): void {
    const m = /^(\d+):(\d+)$/.exec(resp.headers.get("X-Memlane-Position") ?? "");
    if (m) {
      const [p, o] = [Number(m[1]), Number(m[2])];
      this.positions.set(p, Math.max(this.positions.get(p) ?? 0, o));
    }
  }
}

function isConnectFailure(e: unknown): boolean {
  const code = (e as { cause?: { code?: string } })?.cause?.code;
  return code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EHOSTUNREACH";
}
