"""Chakra execution traces (the workload format of ASTRA-sim 2.0) read into hcsim workload graphs.

A trace is one file per rank, ``PREFIX.<rank>.et`` (ranks 0..N-1): a
``GlobalMetadata`` message, then ``Node`` messages, each preceded by its
length as a varint. hcsim declares the messages itself, for the fields it
reads, with the field numbers and types of the published Chakra schema (a
fact of the format: ``Node`` id 1 uint64, name 2, type 3, ctrl_deps 4 and
data_deps 5 repeated uint64, start_time_micros 6, duration_micros 7, inputs 8,
outputs 9, attr 10 repeated ``AttributeProto``), and reads them with PyPI's
``protobuf``; fields it does not declare are skipped.

What each node becomes (one vertex per node, on the XPU of its rank):

- ``COMP_NODE``: a compute vertex. Its time is ``duration_micros`` (the
  measured time, as ASTRA-sim replays it) when > 0, else attribute
  ``num_ops`` FLOPs at the XPU's FLOP/s (``precision``); attribute
  ``tensor_size`` (bytes) is the memory it reads.
- ``COMM_COLL_NODE``: attributes ``comm_type`` (``CollectiveCommType``:
  ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST) and
  ``comm_size`` (bytes: hcsim's S, :mod:`hcsim.engine.collectives`), over the
  communicator group named by ``pg_name`` (all ranks without one). The k-th
  collective of a group in every member's trace is one collective vertex;
  their types and sizes must agree.
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: attributes ``comm_dst`` /
  ``comm_src`` (the peer rank), ``comm_tag`` and ``comm_size``; the k-th send
  from s to d with a tag and the k-th receive on d from s with that tag are
  one point-to-point vertex (s, d).

Both ``data_deps`` and ``ctrl_deps`` are dependencies (per XPU: a vertex's
instance on a rank waits for its predecessors' instances on that rank). A
trace is one iteration: each rank's last nodes feed its first ones over
``skip_first_iteration`` edges, so iteration k+1 starts on a rank when
iteration k has ended there.

Communicator groups are ASTRA-sim's JSON file ``{"<pg_name>": [rank, ...],
...}`` (``PREFIX.groups.json`` beside the traces, or given explicitly).

Units. Chakra sizes are bytes and times microseconds, imported exactly. Bandwidths are not part of a
trace, but beware when copying an ASTRA-sim network config into an hcsim platform: ASTRA-sim's "GB/s" is
2^30 B/s (GiB/s) while hcsim's GB/s is 1e9 B/s, so ASTRA-sim's ``bandwidth: 25`` is ``25GiB/s`` in hcsim
(26.84 GB/s: writing ``25GB/s`` would make every link 7.4 % slower).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from hcsim.errors import WorkloadError
from hcsim.workload.graph import add_comm, add_compute, add_dependency, covered_xpus, new_workload, validate_workload

__all__ = ["GlobalMetadata", "Node", "AttributeProto", "NODE_TYPES", "COLLECTIVE_TYPES", "UNITS_NOTE",
           "read_trace", "write_trace", "import_chakra", "trace_files", "attribute"]

UNITS_NOTE = ("units: Chakra sizes are bytes and times microseconds (imported exactly); ASTRA-sim's network "
              "'GB/s' is 2^30 B/s, hcsim's GB/s is 1e9 B/s: write ASTRA-sim's 'bandwidth: 25' as 25GiB/s "
              "(25GB/s would be 7.4 % slower)")

NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3, "COMP_NODE": 4,
              "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
"""Chakra's NodeType values (the schema's enum)."""

COLLECTIVE_TYPES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4, "BROADCAST": 5,
                    "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
"""Chakra's CollectiveCommType values (the schema's enum)."""

_HCSIM_COLLECTIVE = {0: "all_reduce", 2: "all_gather", 5: "broadcast", 6: "all_to_all", 7: "reduce_scatter"}
_TYPE_NAME = {value: name for name, value in NODE_TYPES.items()}
_COLLECTIVE_NAME = {value: name for name, value in COLLECTIVE_TYPES.items()}

# ---- the messages, declared for the fields hcsim reads (numbers and types as in Chakra's et_def schema) -------

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "uint64": _F.TYPE_UINT64, "int64": _F.TYPE_INT64, "int32": _F.TYPE_INT32,
            "uint32": _F.TYPE_UINT32, "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "bool": _F.TYPE_BOOL}
_MESSAGES = {
    "AttributeProto": [("name", 1, "string"), ("doc_string", 2, "string"), ("double_val", 3, "double"),
                       ("float_val", 5, "float"), ("int32_val", 7, "int32"), ("int64_val", 9, "int64"),
                       ("uint32_val", 11, "uint32"), ("uint64_val", 13, "uint64"), ("bool_val", 27, "bool"),
                       ("string_val", 29, "string")],
    "GlobalMetadata": [("version", 1, "string"), ("attr", 2, "[AttributeProto")],
    "IOInfo": [("values", 1, "string"), ("shapes", 2, "string"), ("types", 3, "string")],
    "Node": [("id", 1, "uint64"), ("name", 2, "string"), ("type", 3, "NodeType"), ("ctrl_deps", 4, "[uint64"),
             ("data_deps", 5, "[uint64"), ("start_time_micros", 6, "uint64"), ("duration_micros", 7, "uint64"),
             ("inputs", 8, "IOInfo"), ("outputs", 9, "IOInfo"), ("attr", 10, "[AttributeProto")],
}
_ONEOF = ("double_val", "float_val", "int32_val", "int64_val", "uint32_val", "uint64_val", "bool_val", "string_val")


def _message_classes() -> dict[str, type]:
    """Build the message classes at import time in a pool of hcsim's own (no protoc step)."""
    package = "hcsim.chakra"
    file = descriptor_pb2.FileDescriptorProto(name="hcsim_chakra.proto", package=package, syntax="proto3")
    node_type = file.enum_type.add(name="NodeType")
    for name, number in NODE_TYPES.items():
        node_type.value.add(name=name, number=number)
    for message_name, fields in _MESSAGES.items():
        message = file.message_type.add(name=message_name)
        if message_name == "AttributeProto":
            message.oneof_decl.add(name="value")
        for name, number, kind in fields:
            repeated = kind.startswith("[")
            kind = kind.lstrip("[")
            field = message.field.add(name=name, number=number,
                                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            elif kind == "NodeType":
                field.type, field.type_name = _F.TYPE_ENUM, f".{package}.NodeType"
            else:
                field.type, field.type_name = _F.TYPE_MESSAGE, f".{package}.{kind}"
            if name in _ONEOF:
                field.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in _MESSAGES}


_CLASSES = _message_classes()
GlobalMetadata = _CLASSES["GlobalMetadata"]
Node = _CLASSES["Node"]
AttributeProto = _CLASSES["AttributeProto"]


def attribute(name: str, **value) -> "AttributeProto":
    """An AttributeProto: ``attribute("comm_size", int64_val=634_000_000)``."""
    return AttributeProto(name=name, **value)


# ---- files --------------------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def write_trace(path: str | Path, nodes, *, version: str = "0.0.4") -> None:
    """Write one rank's trace: GlobalMetadata(version), then `nodes` (Node messages), each length-prefixed."""
    chunks = []
    for message in (GlobalMetadata(version=version), *nodes):
        data = message.SerializeToString()
        chunks += [_varint(len(data)), data]
    Path(path).write_bytes(b"".join(chunks))


def read_trace(path: str | Path) -> tuple["GlobalMetadata", list["Node"]]:
    """One rank's trace: its GlobalMetadata and its Nodes in file order.

    Raises WorkloadError naming the file and the byte offset of a message that is cut short or does not parse.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise WorkloadError(f"{path}: cannot read the Chakra trace: {err.strerror}") from err
    messages, pos = [], 0
    while pos < len(data):
        start, size, shift = pos, 0, 0
        while True:
            if pos >= len(data) or shift > 63:
                raise WorkloadError(f"{path}: message at byte {start}: its length prefix (a varint) is cut short; "
                                    f"fix: a Chakra .et file is length-prefixed messages")
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + size > len(data):
            raise WorkloadError(f"{path}: message at byte {start} claims {size} bytes but only {len(data) - pos} "
                                f"remain (a truncated file?)")
        message = GlobalMetadata() if not messages else Node()
        try:
            message.ParseFromString(data[pos:pos + size])
        except DecodeError as err:
            what = "GlobalMetadata" if not messages else f"node message #{len(messages)}"
            after = f" (after node id {messages[-1].id})" if len(messages) > 1 else ""
            raise WorkloadError(f"{path}: {what} at byte {start}{after} does not parse: {err}") from err
        messages.append(message)
        pos += size
    if not messages:
        raise WorkloadError(f"{path}: empty file; a Chakra trace starts with a GlobalMetadata message")
    return messages[0], messages[1:]


def trace_files(prefix: str | Path) -> list[Path]:
    """The files ``PREFIX.<rank>.et`` in rank order; ranks must be 0..N-1."""
    prefix = Path(prefix)
    pattern = re.compile(re.escape(prefix.name) + r"\.(\d+)\.et$")
    found = {}
    if prefix.parent.is_dir():
        for path in prefix.parent.iterdir():
            match = pattern.match(path.name)
            if match:
                found[int(match.group(1))] = path
    if not found:
        raise WorkloadError(f"chakra:{prefix}: no trace files {prefix}.<rank>.et (e.g. {prefix}.0.et)")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise WorkloadError(f"chakra:{prefix}: ranks {', '.join(map(str, missing[:5]))} have no trace file "
                            f"(found {len(found)} files up to rank {max(found)}); fix: one {prefix}.<rank>.et per rank")
    return [found[rank] for rank in sorted(found)]


# ---- import -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Item:
    """One node of one rank: where it is (for errors) and its attributes by name."""

    rank: int
    path: Path
    node: "Node"
    attrs: dict

    def where(self, field: str) -> str:
        return f"{self.path}: node {self.node.id}: {field}"


def _attributes(node) -> dict:
    values = {}
    for attr in node.attr:
        kind = attr.WhichOneof("value")
        values[attr.name] = getattr(attr, kind) if kind else None
    return values


def _int_attr(item: _Item, name: str, required: bool = True, default: int | None = None) -> int | None:
    value = item.attrs.get(name, default)
    if value is None and required:
        raise WorkloadError(f"{item.where(name)}: missing attribute (a {_TYPE_NAME[item.node.type]} needs it)")
    if value is not None and (isinstance(value, (bool, str)) or not float(value).is_integer() or value < 0):
        raise WorkloadError(f"{item.where(name)}: expected an integer >= 0, got {value!r}")
    return None if value is None else int(value)


def _rank_name(rank: int) -> str:
    return f"rank{rank}"


def import_chakra(prefix: str | Path, *, groups: str | Path | dict | None = None, precision: str = "fp32",
                  name: str | None = None) -> nx.DiGraph:
    """The hcsim workload graph of the Chakra trace ``PREFIX.<rank>.et`` (module docstring).

    Parameters
    ----------
    prefix : path prefix of the rank files.
    groups : communicator groups, ``{pg_name: [ranks]}`` or a JSON file of it; None: ``PREFIX.groups.json``
        if it exists.
    precision : FLOP/s used for nodes timed by ``num_ops`` ("fp32", "fp16", "bf16").
    name : the workload's name (default: the prefix's file name).

    Returns
    -------
    networkx.DiGraph
        A workload graph (:mod:`hcsim.workload.graph`) over XPUs ``rank0`` .. ``rank{N-1}``, validated.

    Raises
    ------
    WorkloadError
        naming the file, node id and field of the first problem found.
    """
    prefix = Path(prefix)
    files = trace_files(prefix)
    ranks = len(files)
    pg = _groups(prefix, groups, ranks)
    from hcsim.limits import MAX_GRAPH_VERTICES, check_limit, check_range

    items: list[list[_Item]] = []
    total = 0
    for rank, path in enumerate(files):
        _, nodes = read_trace(path)
        if not nodes:
            raise WorkloadError(f"{path}: no nodes after the GlobalMetadata message; a rank's trace holds the nodes "
                                f"it runs (every rank 0..{ranks - 1} needs at least one)")
        total += len(nodes)
        check_limit(total, MAX_GRAPH_VERTICES, f"the nodes of ranks 0..{rank}", f"chakra:{prefix}",
                    "a shorter trace (fewer nodes per rank, or fewer ranks)")
        seen: set[int] = set()
        mine = []
        for node in nodes:
            if node.id in seen:
                raise WorkloadError(f"{path}: node {node.id}: id: used by an earlier node of this file")
            seen.add(node.id)
            mine.append(_Item(rank, path, node, _attributes(node)))
        for item in mine:
            for field in ("data_deps", "ctrl_deps"):
                for dep in getattr(item.node, field):
                    if dep == item.node.id:
                        raise WorkloadError(f"{item.where(field)}: names the node itself; a node depends on "
                                            f"earlier nodes only")
                    if dep not in seen:
                        raise WorkloadError(f"{item.where(field)}: no node {dep} in this file")
            problem = check_range(item.node.duration_micros * 1e-6, "duration", item.where("duration_micros"),
                                  f"{item.node.duration_micros} us")
            if problem:
                raise WorkloadError(problem)
        items.append(mine)
    graph = new_workload(name or prefix.name, precision=precision)
    vertex: dict[tuple[int, int], str] = {}  # (rank, node id) -> vertex
    _add_compute_vertices(graph, items, vertex)
    _add_collectives(graph, items, pg, vertex)
    _add_point_to_point(graph, items, vertex)
    _add_edges(graph, items, vertex)
    try:
        validate_workload(graph)
    except WorkloadError as err:
        raise WorkloadError(f"chakra:{prefix}: the imported graph is invalid: {err}") from err
    return graph


def _groups(prefix: Path, groups, ranks: int) -> dict[str, tuple[int, ...]]:
    source = groups
    if groups is None:
        default = prefix.parent / f"{prefix.name}.groups.json"
        source = default if default.is_file() else {}
    where = str(source) if not isinstance(source, dict) else "communicator groups"
    if not isinstance(source, dict):
        try:
            source = json.loads(Path(source).read_text())
        except (OSError, ValueError) as err:
            raise WorkloadError(f"{where}: cannot read the communicator groups JSON: {err}") from err
    if not isinstance(source, dict):
        raise WorkloadError(f"{where}: expected {{\"<pg_name>\": [rank, ...], ...}}, got {type(source).__name__}")
    table = {}
    for key, members in source.items():
        if not (isinstance(members, list) and members and all(isinstance(r, int) and not isinstance(r, bool)
                                                              for r in members)):
            raise WorkloadError(f"{where}: group {key!r}: expected a non-empty list of ranks, got {members!r}")
        bad = [r for r in members if not 0 <= r < ranks]
        if bad or len(set(members)) != len(members):
            raise WorkloadError(f"{where}: group {key!r}: ranks must be distinct and in 0..{ranks - 1}, got {members}")
        table[str(key)] = tuple(members)
    return table


# The mapping onto the workload-graph API lives in these four functions (one call each to add_compute,
# add_comm and add_dependency), so a change of that API is a change here.


def _add_compute_vertices(graph, items, vertex) -> None:
    for mine in items:
        for item in mine:
            node = item.node
            if node.type != NODE_TYPES["COMP_NODE"]:
                if node.type not in (NODE_TYPES["COMM_COLL_NODE"], NODE_TYPES["COMM_SEND_NODE"],
                                     NODE_TYPES["COMM_RECV_NODE"]):
                    raise WorkloadError(f"{item.where('type')}: {_TYPE_NAME.get(node.type, node.type)} is not "
                                        f"supported; hcsim reads COMP_NODE, COMM_COLL_NODE, COMM_SEND_NODE, "
                                        f"COMM_RECV_NODE")
                continue
            flops = _int_attr(item, "num_ops", required=False, default=0)
            size = _int_attr(item, "tensor_size", required=False, default=0)
            if not flops and not node.duration_micros:
                raise WorkloadError(f"{item.where('duration_micros')}: a COMP_NODE needs its time: duration_micros "
                                    f"> 0 (measured) or attribute num_ops > 0 (FLOPs); it has neither")
            duration = node.duration_micros * 1e-6 if node.duration_micros > 0 or not flops else None
            key = f"{_rank_name(item.rank)}.n{node.id}"
            add_compute(graph, key, xpus=(_rank_name(item.rank),), flops=float(flops), memory_bytes=float(size),
                        duration=duration, label=node.name or key)
            vertex[item.rank, node.id] = key


def _add_collectives(graph, items, pg, vertex) -> None:
    everyone = tuple(range(len(items)))
    queues: dict[tuple[int, ...], dict[int, list[_Item]]] = defaultdict(lambda: defaultdict(list))
    names: dict[tuple[int, ...], str] = {}
    for mine in items:
        for item in mine:
            if item.node.type != NODE_TYPES["COMM_COLL_NODE"]:
                continue
            group_name = item.attrs.get("pg_name")
            if group_name in (None, ""):
                group, label = everyone, "all"
            elif str(group_name) in pg:
                group, label = pg[str(group_name)], str(group_name)
            else:
                raise WorkloadError(f"{item.where('pg_name')}: communicator group {group_name!r} is not in the "
                                    f"groups JSON (known: {', '.join(sorted(pg)) or 'none'}); fix: give "
                                    f"{{\"{group_name}\": [ranks]}} in PREFIX.groups.json")
            if item.rank not in group:
                raise WorkloadError(f"{item.where('pg_name')}: rank {item.rank} is not a member of group {label!r}")
            queues[group][item.rank].append(item)
            names[group] = label
    for group, by_rank in queues.items():
        counts = {rank: len(by_rank.get(rank, [])) for rank in group}
        if len(set(counts.values())) > 1:
            few, most = min(counts, key=counts.get), max(counts, key=counts.get)
            last = by_rank[most][counts[few]]
            raise WorkloadError(f"{last.where('pg_name')}: collective #{counts[few]} of group {names[group]!r} has "
                                f"no counterpart in rank {few}'s trace ({counts[few]} collectives on that group "
                                f"there, {counts[most]} here): the k-th collective of a group must be in every "
                                f"member's trace")
        members = [by_rank[rank] for rank in group]
        for k, matched in enumerate(zip(*members)):
            first = matched[0]
            kind = _int_attr(first, "comm_type")
            size = _int_attr(first, "comm_size")
            for item in matched[1:]:
                if _int_attr(item, "comm_type") != kind or _int_attr(item, "comm_size") != size:
                    raise WorkloadError(f"{item.where('comm_type/comm_size')}: collective #{k} of group "
                                        f"{names[group]!r} is {_COLLECTIVE_NAME.get(kind, kind)} of {size} B on "
                                        f"rank {first.rank} (node {first.node.id}) but "
                                        f"{_COLLECTIVE_NAME.get(_int_attr(item, 'comm_type'), '?')} of "
                                        f"{_int_attr(item, 'comm_size')} B here")
            if kind not in _HCSIM_COLLECTIVE:
                raise WorkloadError(f"{first.where('comm_type')}: {_COLLECTIVE_NAME.get(kind, kind)} is not supported; "
                                    f"hcsim runs {', '.join(_COLLECTIVE_NAME[c] for c in sorted(_HCSIM_COLLECTIVE))}")
            key = f"coll.{names[group]}.{k}"
            add_comm(graph, key, xpus=tuple(map(_rank_name, group)), bytes=float(size), collective=_HCSIM_COLLECTIVE[kind],
                     label=first.node.name or key)
            for item in matched:
                vertex[item.rank, item.node.id] = key


def _add_point_to_point(graph, items, vertex) -> None:
    ranks = len(items)
    sends: dict[tuple[int, int, int], list[_Item]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[_Item]] = defaultdict(list)
    for mine in items:
        for item in mine:
            node_type = item.node.type
            if node_type not in (NODE_TYPES["COMM_SEND_NODE"], NODE_TYPES["COMM_RECV_NODE"]):
                continue
            send = node_type == NODE_TYPES["COMM_SEND_NODE"]
            peer = _int_attr(item, "comm_dst" if send else "comm_src")
            if peer >= ranks or peer == item.rank:
                raise WorkloadError(f"{item.where('comm_dst' if send else 'comm_src')}: peer rank {peer} must be "
                                    f"another rank in 0..{ranks - 1}")
            tag = _int_attr(item, "comm_tag", required=False, default=0)
            _int_attr(item, "comm_size")
            key = (item.rank, peer, tag) if send else (peer, item.rank, tag)
            (sends if send else recvs)[key].append(item)
    for key in sorted(set(sends) | set(recvs)):
        out, into = sends.get(key, []), recvs.get(key, [])
        if len(out) != len(into):
            extra = (out if len(out) > len(into) else into)[min(len(out), len(into))]
            other = "COMM_RECV_NODE" if len(out) > len(into) else "COMM_SEND_NODE"
            raise WorkloadError(f"{extra.where('comm_dst' if extra in out else 'comm_src')}: no matching {other} "
                                f"(rank {key[0]} -> rank {key[1]}, comm_tag {key[2]}) in the other rank's trace")
        src, dst, tag = key
        for k, (send, recv) in enumerate(zip(out, into)):
            size = _int_attr(send, "comm_size")
            if _int_attr(recv, "comm_size") != size:
                raise WorkloadError(f"{recv.where('comm_size')}: {_int_attr(recv, 'comm_size')} B, but the matching "
                                    f"send (rank {src}, node {send.node.id}) sends {size} B")
            name = f"p2p.{src}.{dst}.{tag}.{k}"
            add_comm(graph, name, xpus=(_rank_name(src), _rank_name(dst)), bytes=float(size), collective="p2p",
                     label=send.node.name or name)
            vertex[src, send.node.id] = vertex[dst, recv.node.id] = name


def _add_edges(graph, items, vertex) -> None:
    edges: set[tuple[str, str, bool]] = set()
    for mine in items:
        has_successor: set[int] = set()
        sources = []
        for item in mine:
            deps = list(item.node.data_deps) + list(item.node.ctrl_deps)
            has_successor.update(deps)
            if not deps:
                sources.append(item.node.id)
            for dep in deps:
                u, v = vertex[item.rank, dep], vertex[item.rank, item.node.id]
                if u != v:
                    edges.add((u, v, False))
        sinks = [item.node.id for item in mine if item.node.id not in has_successor]
        for sink in sinks:  # the next iteration starts on this rank when this one has ended on it
            for source in sources:
                u, v = vertex[mine[0].rank, sink], vertex[mine[0].rank, source]
                if u != v:
                    edges.add((u, v, True))
    for u, v, skip in sorted(edges):
        if not graph.has_edge(u, v):  # sorted: an edge of the same iteration comes first and implies the other
            add_dependency(graph, u, v, skip_first_iteration=skip)
    for name, data in graph.nodes(data=True):  # a start vertex: one of its units waits for nothing in iteration 1
        covered: set | None = set()
        for u, _, edge in graph.in_edges(name, data=True):
            if not edge["skip_first_iteration"]:
                xpus = covered_xpus(graph, u, name, edge["wait"])
                if xpus is None:
                    covered = None
                    break
                covered |= xpus
        data["start"] = covered is not None and not covered.issuperset(data["xpus"])
