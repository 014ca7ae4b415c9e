"""Followed keys are one per process: two runners of one process (a worker and its companion)
must not hold two keyrings, or a runner that catches up on its own would leave the codec's
cipher without the key a new agent's first command is sealed under, and drop the command as
if its key were destroyed."""

from __future__ import annotations

import uuid

from events import codec
from projections.keys import Keyring, LocalKeyFile
from workers.runtime.data_keys import KeyTopic, open_keys


async def test_two_users_of_a_process_share_the_keys_the_codec_opens_with(settings):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}shk{uuid.uuid4().hex[:6]}."})
    first, second = await open_keys(s), await open_keys(s)
    try:
        assert first is second and codec.cipher() is first.keyring
        # Another process makes a key for a new subject and publishes it, then seals with it.
        other = KeyTopic(s, Keyring(LocalKeyFile.create(s.key_file)))
        await other.start(follow=False)
        token = other.keyring.seal("t/new-agent", b"aad", b"hello")
        await other.flush()
        await other.stop()
        await first.catch_up()  # what a runner does when a message names a key it lacks
        assert codec.cipher().open(token, b"aad") == b"hello"
        await second.stop()  # one user stops: the other still follows
        assert first._task is not None and not first._task.done()
    finally:
        await first.stop()
    assert first._task.done()
