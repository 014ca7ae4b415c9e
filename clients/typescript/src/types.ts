// The requests and answers of memlane's HTTP API. Request types name the body fields of the
// OpenAPI document's schemas (test/openapi.test.ts checks each one against it).

export type Scope = "AGENT" | "SESSION" | "USER";
export type Status = "ACTIVE" | "SUPERSEDED" | "DELETED" | "PENDING" | "CONFLICTING";
export type SearchMode = "hybrid" | "lexical" | "vector";
export type Role = "agent" | "helper" | "member" | "operator";

export interface Provenance {
  source?: string | null;
  session?: string | null;
  turn?: number | null;
  execution_id?: string | null;
  invocation?: number | null;
  agent_version?: number | null;
  [field: string]: unknown;
}

export interface MemoryRecord {
  id: string;
  version: number;
  created: string;
  modified: string;
  tenant: string;
  agent: string;
  scope: Scope;
  session: string | null;
  user: string | null;
  kind: string;
  summary: string;
  content: string;
  metadata: Record<string, unknown>;
  labels: Record<string, string>;
  key: string | null;
  confidence: number | null;
  importance: number;
  usage_count: number;
  utility: number;
  expires_at: string | null;
  status: Status;
  pinned: boolean;
  replaces: string | null;
  replaced_by: string | null;
  preview: boolean;
  provenance: Provenance;
  tags: string[];
  classification: string | null;
  observed_at: string | null;
  valid_from: string | null;
  valid_to: string | null;
  recorded_at: string | null;
  /** Set on search hits: the ranking's score. */
  score?: number;
}

/** `POST /v1/memory` (AddRequest). */
export interface AddRequest {
  summary: string;
  content?: string;
  kind?: string | null;
  scope?: "agent" | "session" | "user" | Scope | null;
  labels?: Record<string, string>;
  metadata?: Record<string, unknown>;
  tags?: string[];
  key?: string | null;
  pinned?: boolean;
  replaces?: string | null;
  confidence?: number | null;
  importance?: number | null;
  classification?: string | null;
  expires_at?: string | null;
  observed_at?: string | null;
  valid_from?: string | null;
  valid_to?: string | null;
  run_id?: string | null;
  layer?: string | null;
  source_ref?: string | null;
  expected_version?: number | null;
  /** Makes the write safe to send again: the ledger applies a command id once. Set for you. */
  command_id?: string | null;
}

export interface WriteResult {
  status: string;
  memories: MemoryRecord[];
  merged?: boolean;
  [field: string]: unknown;
}

/** `POST /v1/memory/search` (SearchRequest). */
export interface SearchRequest {
  query?: string | null;
  kind?: string | null;
  labels?: Record<string, string>;
  tags?: string[];
  ids?: string[];
  limit?: number | null;
  after?: string | null;
  mode?: SearchMode | null;
  min_score?: number | null;
  /** Memory as it stood then: a time with its UTC offset, or a log position. */
  as_of?: string | null;
}

export interface SearchResult {
  records: (MemoryRecord & { score: number | null; trust: Record<string, unknown> })[];
  next_cursor: string | null;
}

export interface ListOptions {
  first?: number;
  after?: string;
  sort?: "DESC" | "ASC";
  as_of?: string;
  valid_at?: string;
}

export interface Page {
  records: MemoryRecord[];
  next_cursor: string | null;
}

/** `POST /v1/recall` (RecallRequest). */
export interface RecallRequest {
  conversation: string;
  text: string;
  run_id?: string | null;
  application?: string | null;
  /** Names the attempt: a retry is shown what the first attempt showed. Set for you. */
  request_id?: string | null;
  as_of?: string | null;
}

export interface RecallResult {
  rendered: string;
  pinned: { id: string; summary: string; version: number }[];
  workspaceEntries: MemoryRecord[];
  relevantEpisodes: MemoryRecord[];
  procedures: MemoryRecord[];
  antiPatterns: MemoryRecord[];
  blocks: { scope: string; label: string; text: string; application: string | null }[];
  sessionSummary: string | null;
  sessionEntries: Record<string, unknown>[];
  skipped?: { code: string; field: string | null; reason: string };
  memory_unavailable?: boolean;
  [layer: string]: unknown;
}

/** `POST /v1/history/search` (HistorySearchRequest). */
export interface HistorySearchRequest {
  query?: string | null;
  scope?: string;
  kind?: string;
  conversation?: string | null;
  session?: string | null;
  turn?: number | null;
  day?: string | null;
  since?: number | null;
  until?: number | null;
  /** When the question is asked (Unix ms): a time it names ("last week") ranks what was said then first. */
  now?: number | null;
  ids?: string[];
  limit?: number;
  cursor?: string | null;
  mode?: SearchMode | null;
}

/** `PUT /v1/notes/{note_id}` (SaveNoteRequest). */
export interface SaveNoteRequest {
  topic: string;
  summary: string;
  source_messages: string[];
  expected_revision: number;
}

/** `PUT /v1/profiles/{user}` (ProfileRequest). */
export interface ProfileRequest {
  text: string;
  expected_version?: number | null;
}

export interface Profile {
  user: string;
  text: string;
  version: number;
  [field: string]: unknown;
}

/** `POST /v1/admin/keys` (KeyRequest). */
export interface KeyRequest {
  tenant: string;
  agent?: string | null;
  role?: Role;
  user?: string | null;
}

export interface KeyEntry {
  id: string;
  tenant: string;
  agent: string | null;
  role: Role;
  created: string;
  user?: string | null;
}

export interface Consent {
  user: string;
  consent: string | null;
  [field: string]: unknown;
}
