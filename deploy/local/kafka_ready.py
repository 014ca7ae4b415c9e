"""Exit 0 when the broker at argv[1] answers a metadata request."""

import asyncio
import sys

from aiokafka.admin import AIOKafkaAdminClient


async def main(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    await admin.start()
    try:
        await admin.describe_cluster()
    finally:
        await admin.close()


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1]), 5))
    except Exception:
        sys.exit(1)
