"""Exit 0 when the broker at argv[1] answers a metadata request.

With argv[2] (a count), argv[1] may list several comma-separated addresses: each must answer,
and the metadata each bootstrap gives must list at least that many live (unfenced) brokers."""

import asyncio
import sys

from aiokafka.admin import AIOKafkaAdminClient


async def brokers_seen(address: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=address, request_timeout_ms=3000)
    await admin.start()
    try:
        return len((await admin.describe_cluster())["brokers"])
    finally:
        await admin.close()


async def main(bootstrap: str, wanted: int) -> None:
    addresses = bootstrap.split(",") if wanted else [bootstrap]
    seen = await asyncio.gather(*(brokers_seen(a) for a in addresses))
    if min(seen) < wanted:
        raise RuntimeError(f"brokers seen: {seen}, wanted {wanted}")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0), 5))
    except Exception:
        sys.exit(1)
