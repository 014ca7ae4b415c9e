"""The memory ledger's rules: pure functions over the contract models.

`decide(state, command)` returns the events a command produces; `evolve(state, event)`
folds one event into the state. The ledger worker is these two functions plus Kafka.
The state is a handful of mappings of frozen models, folded from the ledger's own events, all
keyed under `tenant/agent` so one agent can never address another agent's records.

Everything here is deterministic in the command: ids and timestamps derive from the
command's tenant, agent and id and its `issued_at`, so a redelivered command produces
byte-identical events, and two agents that pick the same command id get different ids.

The package, by command family; imports point down this list, never up:

- `decide`: `decide` and its handler tables, the turn transaction, `overdue`, the refusals.
- `subject_commands`: consent, erasure, removal of an agent or a member.
- `agent`: an agent's configuration and blocks.
- `changes`: edit, delete, pin and unpin, a procedure's outcome, the expiry sweep.
- `records`: a new record (`AddMemory`), and which records a command may address.
- `fold`: `evolve` and the record store.
- `erasure`: `RemoveTenant`, and what the state forgets of an erased subject (`SubjectErased`).
- `subject_rules`: the subject keys, who may address a member's record, admission, consent.
- `state`: the constants, `LedgerState`, ids, the events a rule builds, the scratch copy.

Callers import from here (`from events.rules.ledger import decide, evolve, LedgerState`).
"""

from events.base import command_key
from events.rules.ledger.decide import Handler, caller, decide, overdue, oversized, refused, reused
from events.rules.ledger.erasure import covers, drop_records, erasure_key, erasure_of, forget, restage
from events.rules.ledger.fold import evolve
from events.rules.ledger.state import (
    DEFAULT_CONFIG,
    LIVE_FACT_CAP,
    MAX_BLOCKS,
    MAX_EXPIRY,
    NAMESPACE,
    RESERVED_KINDS,
    TURN_MEMORY,
    TURN_TIMEOUT,
    LedgerState,
    Rejected,
    agent_key,
    config_of,
    event_id,
    get_record,
    normalized_hash,
    outcome_of,
    record_id_for,
    scratch_state,
)

__all__ = [
    "DEFAULT_CONFIG",
    "LIVE_FACT_CAP",
    "MAX_BLOCKS",
    "MAX_EXPIRY",
    "NAMESPACE",
    "RESERVED_KINDS",
    "TURN_MEMORY",
    "TURN_TIMEOUT",
    "Handler",
    "LedgerState",
    "Rejected",
    "scratch_state",  # a test builds a scratch state
    "agent_key",
    "caller",
    "command_key",
    "config_of",
    "covers",
    "decide",
    "drop_records",
    "erasure_key",
    "erasure_of",
    "event_id",
    "evolve",
    "forget",
    "get_record",
    "normalized_hash",
    "outcome_of",
    "overdue",
    "oversized",
    "record_id_for",
    "refused",
    "restage",
    "reused",
]
