"""Which parquet columns datamask writes with a dictionary.

pyarrow dictionary-encodes every column by default, and falls back to plain pages only
once a column chunk's dictionary passes 1 MB. An embedding or a score has a value no other
row shares, so for them the dictionary is pure cost: every row group starts with up to
262,144 floats hashed into a 1 MB dictionary page that nothing reads twice. ``apply`` of a
1M-row corpus of 10,000-row shards at 10% (row groups of ~1,000 kept rows) took 7.0-8.1 s
and wrote 205.0 MB of kept shards with it, 5.3-6.2 s and 143.5 MB without, the same rows
(``benchmarks/apply/RESULTS.md``, "Floats without a dictionary"). Every other column keeps
its dictionary: a ``source`` or ``license`` column of a few values shrinks to almost
nothing with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

__all__ = ["dictionary_columns"]


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The parquet column paths of ``schema`` worth a dictionary (``use_dictionary=`` of
    :func:`pyarrow.parquet.write_table` and :class:`pyarrow.parquet.ParquetWriter`): every
    leaf column but floating-point numbers and fixed-size binary values (embedding rows
    stored raw), alone or in lists.

    >>> schema = pa.schema([("id", pa.string()), ("emb", pa.list_(pa.float32())),
    ...                     ("q", pa.float64()), ("tags", pa.list_(pa.string()))])
    >>> dictionary_columns(schema)
    ['id', 'tags.list.element']
    """
    leaves = (leaf for field in schema for leaf in _leaves(field.name, field.type))
    return [path for path, typ in leaves if _worth(typ)]


def _leaves(path: str, typ: pa.DataType) -> Iterator[tuple[str, pa.DataType]]:
    """``(path, type)`` of every leaf column under ``path``, named as parquet names them
    (pyarrow's compliant nested names: ``list.element``, ``key_value.key``)."""
    if pa.types.is_dictionary(typ):
        yield from _leaves(path, typ.value_type)
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        yield from _leaves(f"{path}.list.element", typ.value_type)
    elif pa.types.is_map(typ):
        yield from _leaves(f"{path}.key_value.key", typ.key_type)
        yield from _leaves(f"{path}.key_value.value", typ.item_type)
    elif pa.types.is_struct(typ):
        for i in range(typ.num_fields):
            yield from _leaves(f"{path}.{typ.field(i).name}", typ.field(i).type)
    else:
        yield path, typ


def _worth(typ: pa.DataType) -> bool:
    """Whether a leaf of this type may repeat its values (a dictionary can pay off)."""
    return not (pa.types.is_floating(typ) or pa.types.is_fixed_size_binary(typ))
