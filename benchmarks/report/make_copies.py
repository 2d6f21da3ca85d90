"""Rewrite a corpus with small row groups, and a copy of it repeated ``--times`` times (ids
suffixed per copy), to measure the report's memory against N (benchmarks/report/RESULTS.md).

    python benchmarks/report/make_copies.py ../shared/data/realtext.parquet /tmp/rt/x1.parquet
    python benchmarks/report/make_copies.py ../shared/data/realtext.parquet /tmp/rt/x4.parquet \
        --times 4
"""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--times", type=int, default=1)
    p.add_argument("--row-group", type=int, default=8192)
    args = p.parse_args()
    table = pq.read_table(args.input)
    with pq.ParquetWriter(args.output, table.schema, compression="zstd") as w:
        for copy in range(args.times):
            t = table
            if copy:
                ids = pc.binary_join_element_wise(t["chunk_id"], pa.scalar(f"#{copy}"), "")
                t = t.set_column(t.schema.get_field_index("chunk_id"), "chunk_id", ids)
            w.write_table(t, row_group_size=args.row_group)
    print(f"wrote {args.output}: {args.times * table.num_rows} rows")


if __name__ == "__main__":
    main()
