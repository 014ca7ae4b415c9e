"""Member profiles (docs/features/profiles.md): one document per member per agent, in recall when the
request names the member."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import Field

from events.base import IDENT_PATTERN
from events.commands import PROFILE_CHARS
from services.http.deps import Ctx, Svc
from services.http.models import Body

router = APIRouter()

UserPath = Annotated[str, Path(min_length=1, max_length=128, pattern=IDENT_PATTERN,
                               description="the member: 1-128 letters, digits or ._:@- characters")]


class ProfileRequest(Body):
    text: Annotated[str, Field(min_length=1, max_length=PROFILE_CHARS,
                               description=f"the whole profile, 1 to {PROFILE_CHARS:,} characters")]
    expected_version: Annotated[int, Field(ge=0, description="the version read (0: none yet); a profile that "
                                           "moved on since is refused with 409 VERSION_CONFLICT")] | None = None


@router.get("/v1/profiles/{user}")
async def read_profile(user: UserPath, ctx: Ctx, s: Svc):
    """The member's profile on the agent: the member's own key, or an agent key speaking for the
    member (X-User naming them). Never an operator key. 404 when there is none."""
    return await s.profiles.read(ctx, user)


@router.put("/v1/profiles/{user}")
async def write_profile(user: UserPath, body: ProfileRequest, ctx: Ctx, s: Svc, wait: bool = True):
    """Replaces the member's profile, whole (at most 4,000 characters): the member's own key, or
    an agent key speaking for the member with `profile_write` in memory.tools. Needs the member's
    consent where the agent requires it."""
    return await s.profiles.write(ctx, user, body.text, body.expected_version, wait=wait)


@router.delete("/v1/profiles/{user}")
async def delete_profile(user: UserPath, ctx: Ctx, s: Svc, wait: bool = True,
                         expected_version: Annotated[int | None, Query(ge=0)] = None):
    """Deletes the member's profile: the member, the agent speaking for them, or an operator key."""
    return await s.profiles.delete(ctx, user, expected_version, wait=wait)
