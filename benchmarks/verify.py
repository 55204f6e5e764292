"""Time the apply's check of staged batches against their manifests (sizes, SHA-256, footers).

    python benchmarks/verify.py STAGING_URI SLOT

Run it on a staging area another benchmark kept (``benchmarks/stage_memory.py --keep`` prints where):
per batch, the bytes checked, the seconds and the rate. The writer's own cost is one hash of the same
bytes (``staging.manifest.hash_file``), also printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_pglogical.staging.manifest import hash_file  # noqa: E402
from airflow_provider_pglogical.staging.reader import StagingReader  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("staging_uri")
    parser.add_argument("slot")
    args = parser.parse_args()
    reader = StagingReader.from_uri(args.staging_uri, args.slot)
    for ref in reader.batches():
        manifest = reader.manifest(ref)
        size = sum(int(f["bytes"]) for f in manifest.files.values())
        t0 = time.perf_counter()
        reader.verify(ref, manifest)
        verify_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for rel in manifest.files:
            hash_file(reader.layout.fs, f"{ref.path}/{rel}")
        hash_s = time.perf_counter() - t0
        print(f"{ref.name}: {manifest.changes} changes, {len(manifest.files)} files, {size / 2**20:.1f} MiB; "
              f"verify {verify_s:.3f}s ({size / 2**20 / verify_s:.0f} MiB/s); "
              f"the writer's hashing {hash_s:.3f}s")


if __name__ == "__main__":
    main()
