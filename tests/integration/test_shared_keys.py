"""Followed keys are one per codec: two runners given one process's codec (a worker and its
companion) share one keys topic follower, so a key either catches up on opens what both read,
and a new agent's first command is never dropped as if its key were destroyed."""

from __future__ import annotations

import uuid

from projections.keys import Keyring, LocalKeyFile
from services.bootstrap import keys_at
from workers.runtime.data_keys import KeyTopic, open_keys


async def test_two_users_of_a_process_share_the_keys_the_codec_opens_with(settings):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}shk{uuid.uuid4().hex[:6]}."})
    codec = keys_at(s)()
    first, second = await open_keys(s, codec), await open_keys(s, codec)
    try:
        assert first is second and codec.cipher is first.keyring
        # Another process makes a key for a new subject and publishes it, then seals with it.
        other = KeyTopic(s, Keyring(LocalKeyFile.create(s.key_file)))
        await other.start(follow=False)
        token = other.keyring.seal("t/new-agent", b"aad", b"hello")
        await other.flush()
        await other.stop()
        await first.catch_up()  # what a runner does when a message names a key it lacks
        assert codec.cipher.open(token, b"aad") == b"hello"
        await second.stop()  # one user stops: the other still follows
        assert first._task is not None and not first._task.done()
    finally:
        await first.stop()
    assert first._task.done()
