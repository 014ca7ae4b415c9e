"""User profiles (docs/features/profiles.md): one document per member per agent, kept by the
ledger as `ProfileChanged` events, whole text and version each time, so a view is the last
event it applied and a rebuild gives every profile back with no model call.

Who writes: the member's own key, or the agent speaking for that member (`user` is always the
member the profile is about); an operator deletes a member's profile but never writes one.
Consent: as for the member's USER records (`subject_rules.consent_refusal`): no write when the
agent requires consent and the member has not granted it, nor one made before the member's
memory was erased. A delete by the member or an operator needs none, as a fact's delete.
Enrichment (`EnrichProfile`, consolidation's preference facts) appends lines, never removes
text: a line already in the profile is not added twice, and a line that would take the
profile over `PROFILE_CHARS` is left out (counted in `skipped`), so a member's own words are
never cut to make room.
"""

from __future__ import annotations

from typing import Any

from events.commands import PROFILE_CHARS, DeleteProfile, EnrichProfile, SetProfile
from events.errors import ErrorCode
from events.memory import ProfileChanged
from events.record import Source
from events.rules.ledger.state import LedgerState, Rejected, config_of, event_base
from events.rules.ledger.subject_rules import consent_refusal, subject_key


def profile_of(state: LedgerState, ak: str, user: str) -> tuple[int, str]:
    """(version, text) of the member's profile: (0, "") for none; a deleted one keeps its
    version with no text."""
    got = state.profiles.get(subject_key(ak, user))
    return (got[0], got[1]) if got else (0, "")


def _member(cmd: Any) -> str:
    if not cmd.user:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "user", "a profile is a member's: name the member (X-User)")
    return cmd.user


def _checks(state: LedgerState, ak: str, cmd: Any, write: bool) -> tuple[str, int, str]:
    """The member, and their profile's (version, text), once `cmd` may change it."""
    user = _member(cmd)
    cfg = config_of(state, ak)
    source = cmd.provenance.source
    # With memory off the member and the operator may still delete: memory off never keeps a
    # member's words against their will (`services.memory.rules.check_enabled`).
    if not cfg.memory.enabled and (write or source not in (Source.MEMBER, Source.OPERATOR)):
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.preview:
        raise Rejected(ErrorCode.PREVIEW_READ_ONLY, "user",
                       "a profile is live memory for every turn; a preview turn cannot change it")
    if write and source is Source.OPERATOR:
        raise Rejected(ErrorCode.FORBIDDEN, "user", "an operator never writes a member's profile; it may delete it")
    if source is Source.MEMBER and cmd.provenance.user not in (None, user):
        raise Rejected(ErrorCode.FORBIDDEN, "user", "a member key writes its own member's profile only")
    if write or source not in (Source.MEMBER, Source.OPERATOR):
        why = consent_refusal(state, ak, cmd, cfg)
        if why is not None:
            raise Rejected(*why)
    version, text = profile_of(state, ak, user)
    expected = getattr(cmd, "expected_version", None)
    current = version if text else 0
    if expected is not None and expected != current:
        raise Rejected(ErrorCode.VERSION_CONFLICT, "expected_version",
                       f"the profile is at version {current}, not {expected}; read it again and write on top of it")
    return user, version, text


def _set(state: LedgerState, ak: str, cmd: SetProfile, events: list) -> None:
    user, version, text = _checks(state, ak, cmd, write=True)
    if cmd.text == text:
        events.append(event_base(ProfileChanged, cmd, user=user, text=text, version=version))  # nothing new: same version
        return
    events.append(event_base(ProfileChanged, cmd, user=user, text=cmd.text, version=version + 1))


def decide_delete(state: LedgerState, ak: str, cmd: DeleteProfile, events: list) -> None:
    user, version, text = _checks(state, ak, cmd, write=False)
    if not text:
        raise Rejected(ErrorCode.NOT_FOUND, "user", "this member has no profile on this agent")
    events.append(event_base(ProfileChanged, cmd, user=user, text="", version=version + 1))


def enriched(text: str, lines: list[str], limit: int = PROFILE_CHARS) -> tuple[str, int, int]:
    """`text` with each of `lines` appended that is not in it yet (whitespace and case aside)
    and still fits within `limit`: (new text, lines added, lines skipped)."""
    have = {" ".join(x.split()).casefold() for x in text.split("\n") if x.strip()}
    out, added, skipped = text, 0, 0
    for line in lines:
        line = " ".join(line.split())
        norm = line.casefold()
        if not line or norm in have:
            skipped += 1
            continue
        grown = f"{out}\n{line}" if out else line
        if len(grown) > limit:
            skipped += 1
            continue
        out, added = grown, added + 1
        have.add(norm)
    return out, added, skipped


def _enrich(state: LedgerState, ak: str, cmd: EnrichProfile, events: list) -> None:
    if cmd.provenance.source is not Source.CONSOLIDATION:
        raise Rejected(ErrorCode.FORBIDDEN, "lines", "profiles are enriched by consolidation only; write the "
                       "whole profile instead (PUT /v1/profiles/{user})")
    user, version, text = _checks(state, ak, cmd, write=True)
    # Checked again here, where it is in force when the command applies: a setting turned off,
    # or a profile the member deleted, is never filled in by a consolidation that started before.
    if not config_of(state, ak).memory.profiles.enrich:
        raise Rejected(ErrorCode.FORBIDDEN, "memory.profiles.enrich", "profile enrichment is off for this agent")
    if not text and version:
        raise Rejected(ErrorCode.NOT_FOUND, "user", "the member deleted their profile: enrichment never makes it again")
    new, added, skipped = enriched(text, list(cmd.lines))
    events.append(event_base(ProfileChanged, cmd, user=user, text=new, version=version + 1 if added else version,
                        added=added, skipped=skipped))


HANDLERS = {SetProfile: _set, DeleteProfile: decide_delete, EnrichProfile: _enrich}


def _profile_changed(state: LedgerState, ak: str, event: Any) -> None:
    """A contract event or its `LedgerView`, which carry `user`, `text` and `version` alike."""
    key = subject_key(ak, event.user)
    if event.version >= profile_of(state, ak, event.user)[0]:
        state.profiles[key] = (event.version, event.text, event.occurred_at)


FOLDS = {"ProfileChanged": _profile_changed}
